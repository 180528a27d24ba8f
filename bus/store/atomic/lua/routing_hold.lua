-- Set a delivered job message aside: a previous boot of this node stored it and may have died
-- before its ack left (node/intake/held.py).
-- KEYS: [1] the consumer's in-flight list, [2] msg_held
-- ARGV: [1] the message key, [2] the member ("<peer id>|<message key>"), [3] its ack deadline (s)
-- Returns: 1 if it was in flight (now held), else 0 (nothing written).
-- Atomic effect: the entry leaves the in-flight list and enters msg_held together, so a crash
-- in between neither loses it nor leaves it in both.
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
return 1
