-- Queue a held job message on msg_in again (node/intake/held.py).
-- KEYS: [1] msg_held, [2] msg_in, [3] the message hash
-- ARGV: [1] the member ("<peer id>|<message key>"), [2] the boot of this node that has just
--       acknowledged it to its peer, or '' when none did (it is past its ack deadline: the
--       consumer refuses it as expired)
-- Returns: 1 if it was held and is queued again, else 0.
-- Atomic effect: the member leaves msg_held and the key is queued once; the hash records the
-- acknowledging boot, so the consumer admits it instead of holding it again.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[3]) == 0 then return 0 end
if ARGV[2] ~= '' then redis.call('HSET', KEYS[3], 'acked_in', ARGV[2]) end
redis.call('LPUSH', KEYS[2], KEYS[3])
return 1
