-- Read every script type's circuit breaker of a context, with Valkey's time (type_breaker).
-- KEYS: type_breakers
-- ARGV: none
-- Returns {now_ms, field, value, ...}: the clock the breakers' times are on, and the hash.
-- Atomic effect: none (a read).
local t = redis.call('TIME')
local out = redis.call('HGETALL', KEYS[1])
table.insert(out, 1, tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
return out
