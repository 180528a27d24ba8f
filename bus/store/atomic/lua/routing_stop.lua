-- Stop a job.
-- KEYS: [1] the job hash, [2] its type queue, [3] the delayed (retry) zset, [4] its stop list
-- ARGV: [1] the reason, [2] now (s), [3] the job key
-- Returns: the status the job had ('' if there is no such job).
-- Atomic effect: a queued job ('dispatched' or 'waiting_for_prerequisites') leaves its queue
-- and the retry schedule and ends in 'error' with the reason (no longer counted for its actor's
-- queue bound: quota_depth; one waiting past its actor's fair share leaves its waiting list:
-- quota_unwait); a 'started' one is announced on
-- the stop list (its runner stops it); a final one is left as it is.
-- include: stats_jobs
-- include: quota_depth
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return '' end
if st == 'dispatched' or st == 'waiting_for_prerequisites' then
  if redis.call('LREM', KEYS[2], 0, ARGV[3]) == 0 then quota_unwait(ARGV[3]) end
  redis.call('ZREM', KEYS[3], KEYS[2] .. '|' .. ARGV[3])
  redis.call('HSET', KEYS[1], 'status', 'error', 'reason', ARGV[1], 'updated_at', ARGV[2])
  stats_ended_queued(KEYS[1], 'error', ARGV[1])
  quota_left(KEYS[1])
elseif st == 'started' then
  redis.call('LPUSH', KEYS[4], ARGV[3])
end
return st
