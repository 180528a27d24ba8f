-- Pop the message deadlines that are due.
-- KEYS: [1] the deadlines zset (members "ack|<message key>" / "result|<message key>")
-- ARGV: [1] now (Unix ms)
-- Returns: {next due time in Unix ms (-1 if none is left), {due member, ...}}
-- Atomic effect: every member scored at or before ARGV[1] leaves the zset, so each deadline is
-- handled once.
-- include: chunked
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
call_chunked('ZREM', KEYS[1], due)  -- one ZREM for what is due, not one per member
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local after = -1
if #nxt > 0 then after = tonumber(nxt[2]) end
return {after, due}
