-- Fragment: the answer fence of the results service, top-level code shared by its scripts.
-- KEYS[1] job, KEYS[2] results_inflight, KEYS[3] attempts; ARGV[2] the status read,
-- ARGV[3] the attempt entry, ARGV[4] the attempt read ('' if none).
-- Answers only the attempt that was read, with the status it ended in, and only once: the job
-- leaves the in-flight list either way; the script returns 0 if the job is already answered or
-- changed since it was read, else the attempt entry is appended (unless '': a first attempt
-- that finished, runs.attempt_entry), the retry the attempt was (retry_of: an external runner's
-- start leaves it) cleared, and the script goes on.
local cur = redis.call('HMGET', KEYS[1], 'answered', 'status', 'attempt', 'retry_of')
if cur[1] or cur[2] ~= ARGV[2] or (cur[3] or '') ~= ARGV[4] then
  redis.call('LREM', KEYS[2], 1, KEYS[1])
  return 0
end
redis.call('LREM', KEYS[2], 1, KEYS[1])
if ARGV[3] ~= '' then redis.call('RPUSH', KEYS[3], ARGV[3]) end
if cur[4] then redis.call('HDEL', KEYS[1], 'retry_of') end
