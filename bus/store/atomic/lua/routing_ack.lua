-- Mark a sent message acknowledged by its peer.
-- KEYS: [1] the message hash
-- ARGV: [1] now (s), [2] the peer that acknowledged it
-- Returns: 1 if the peer is the message's destination, else 0 (nothing written).
-- Atomic effect: only the peer the message was sent to can acknowledge it: acked_at is set,
-- and a message still 'dispatched' turns 'acknowledged' (a later status stands).
local cur = redis.call('HMGET', KEYS[1], 'destination', 'status')
if cur[1] ~= ARGV[2] then return 0 end
if cur[2] == 'dispatched' then
  redis.call('HSET', KEYS[1], 'acked_at', ARGV[1], 'status', 'acknowledged',
             'updated_at', ARGV[1])
else
  redis.call('HSET', KEYS[1], 'acked_at', ARGV[1])
end
return 1
