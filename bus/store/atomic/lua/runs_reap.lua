-- End an attempt whose lease expired: 'error' (the reason says runner_lost), for the results
-- service to retry or answer.
-- KEYS: job running results
-- ARGV: attempt now reason inflight_prefix
-- Returns 1, or 0 (nothing written) if the lease is live again (its score in the running zset
-- is ahead of Valkey's clock) or the job is no longer 'started' with that attempt.
-- Atomic effect: the job taken off running and off its runner's in-flight list
-- ('<inflight_prefix><runner_id>', if it names one), status 'error' with the reason and an
-- empty result, its key pushed on results.
local due = redis.call('ZSCORE', KEYS[2], KEYS[1])
if due then
  local t = redis.call('TIME')
  if tonumber(due) > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then return 0 end
end
local cur = redis.call('HMGET', KEYS[1], 'status', 'attempt', 'runner_id')
if cur[1] ~= 'started' or (cur[2] or '') ~= ARGV[1] then return 0 end
redis.call('ZREM', KEYS[2], KEYS[1])
local rid = cur[3]
if rid and rid ~= '' then redis.call('LREM', ARGV[4] .. rid, 1, KEYS[1]) end
redis.call('HSET', KEYS[1], 'status', 'error', 'reason', ARGV[3], 'result', '{}',
           'updated_at', ARGV[2])
redis.call('LPUSH', KEYS[3], KEYS[1])
return 1
