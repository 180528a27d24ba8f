-- Mark sent messages acknowledged by their peer (one ack frame's, one script call).
-- KEYS: the message hashes
-- ARGV: [1] now (s), [2] the peer that acknowledged them
-- Returns: per message, 1 if the peer is its destination, else 0 (nothing written for it).
-- Atomic effect: only the peer a message was sent to can acknowledge it: acked_at is set,
-- and a message still 'dispatched' turns 'acknowledged' (a later status stands). A key of
-- another type is no message sent: 0, and the others are marked all the same.
local out = {}
for i, key in ipairs(KEYS) do
  local cur = redis.pcall('HMGET', key, 'destination', 'status')
  if cur['err'] or cur[1] ~= ARGV[2] then
    out[i] = 0
  else
    if cur[2] == 'dispatched' then
      redis.call('HSET', key, 'acked_at', ARGV[1], 'status', 'acknowledged', 'updated_at', ARGV[1])
    else
      redis.call('HSET', key, 'acked_at', ARGV[1])
    end
    out[i] = 1
  end
end
return out
