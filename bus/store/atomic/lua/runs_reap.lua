-- End an attempt whose lease expired: 'error' (the reason says runner_lost), for the results
-- service to retry or answer.
-- KEYS: job lease running results
-- ARGV: attempt now reason inflight_prefix
-- Returns 1, or 0 (nothing written) if the lease exists again or the job is no longer
-- 'started' with that attempt.
-- Atomic effect: the job taken off running and off its runner's in-flight list
-- ('<inflight_prefix><runner_id>', if it names one), status 'error' with the reason and an
-- empty result, its key pushed on results.
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local cur = redis.call('HMGET', KEYS[1], 'status', 'attempt')
if cur[1] ~= 'started' or (cur[2] or '') ~= ARGV[1] then return 0 end
redis.call('SREM', KEYS[3], KEYS[1])
local rid = redis.call('HGET', KEYS[1], 'runner_id')
if rid and rid ~= '' then redis.call('LREM', ARGV[4] .. rid, 1, KEYS[1]) end
redis.call('HSET', KEYS[1], 'status', 'error', 'reason', ARGV[3], 'result', '{}',
           'updated_at', ARGV[2])
redis.call('LPUSH', KEYS[4], KEYS[1])
return 1
