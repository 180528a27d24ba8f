-- Keep the lease of a live attempt, re-taking it if it lapsed (a stall longer than its TTL).
-- KEYS: running job
-- ARGV: token ttl_ms attempt
-- Returns 1 if the lease is held now, 0 if the attempt was superseded (the job is not
-- 'started' with that attempt: nothing written). The token is the job's runner field already
-- (the attempt number is the fence): it is not read again.
-- Atomic effect: the job's score in the running zset (its lease's expiry) set to Valkey's
-- clock + ttl_ms, whether or not the lease had lapsed.
local cur = redis.call('HMGET', KEYS[2], 'status', 'attempt')
if cur[1] ~= 'started' or cur[2] ~= ARGV[3] then return 0 end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now_ms + tonumber(ARGV[2]), KEYS[2])
return 1
