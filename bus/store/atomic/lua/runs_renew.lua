-- Keep the lease of a live attempt, re-taking it if it lapsed (a stall longer than its TTL).
-- KEYS: lease job
-- ARGV: token ttl_ms attempt
-- Returns 1 if the lease is held now, 0 if the attempt was superseded (the job is not
-- 'started' with that attempt and the lease is not the token's).
-- Atomic effect: the lease's TTL renewed, or the lease set again to the token; nothing on 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
local cur = redis.call('HMGET', KEYS[2], 'status', 'attempt')
if cur[1] ~= 'started' or cur[2] ~= ARGV[3] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
