-- Queue the flows whose deadline passed.
-- KEYS: [1] flow_deadlines zset, [2] flow_events list
-- ARGV: [1] now (s)
-- Returns: the next deadline (s), or -1 if none is armed.
-- Atomic effect: every flow id scored at or before ARGV[1] moves from the zset onto
-- flow_events (in one step: a crash cannot lose one).
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('LPUSH', KEYS[2], id)
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #nxt > 0 then return tonumber(nxt[2]) end
return -1
