-- End a flow's unfinished jobs.
-- KEYS: the job copies
-- ARGV: [1] the reason, [2] updated_at (s)
-- Returns: how many jobs it ended.
-- Atomic effect: each copy not final ends in 'error' with the reason; final ones stay as they
-- are (a result applied meanwhile stands); a job never released has no copy yet and gets one
-- that says why it never ran.
local ended = 0
for _, key in ipairs(KEYS) do
  local status = redis.call('HGET', key, 'status')
  if (not status) or (status ~= 'finished' and status ~= 'error') then
    redis.call('HSET', key, 'status', 'error', 'reason', ARGV[1], 'updated_at', ARGV[2])
    ended = ended + 1
  end
end
return ended
