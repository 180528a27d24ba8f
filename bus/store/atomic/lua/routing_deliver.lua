-- Deliver one message that arrived over a link.
-- KEYS: [1] the message hash, [2] msg_in
-- ARGV: the hash's fields and values
-- Returns: 1 if the message was stored, 0 if it was already here.
-- Atomic effect: a new message is stored and its key queued on msg_in; a redelivered one (its
-- key exists) changes nothing, so it is acknowledged again but stored and queued once.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
redis.call('LPUSH', KEYS[2], KEYS[1])
return 1
