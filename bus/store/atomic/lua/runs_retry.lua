-- End a failed attempt and schedule the next one.
-- KEYS: job running inflight attempts delayed
-- ARGV: attempt cause now attempt_entry due_ms member ('<queue>|<job key>') [stats: '' or
--       absent, this script counts the attempt in the job statistics; else a runner process's
--       sums (stats_apply), which count it]. cause: the failed attempt's reason.
-- Returns 1, or 0 if the attempt is not the job's current one (runs_fence: nothing written).
-- Atomic effect: the fence's release; the job 'dispatched', its reason the cause and its
-- retry_of the attempt (the retry is typed: runs_begin clears it), the attempt entry appended, the member added to the delayed zset at due_ms; the type breaker told; the job
-- statistics counted or the given sums applied.
-- include: stats_jobs
-- include: type_breaker
-- include: runs_fence
redis.call('HSET', KEYS[1], 'status', 'dispatched', 'reason', ARGV[2], 'retry_of', ARGV[1],
           'updated_at', ARGV[3])
if ARGV[4] ~= '' then redis.call('RPUSH', KEYS[4], ARGV[4]) end
if (ARGV[7] or '') ~= '' then
  stats_apply(ARGV[7])
else
  stats_ended(KEYS[1], 'retry', ARGV[2], known)
end
type_breaker_ended(KEYS[1], 'retry', ARGV[2], known)
redis.call('ZADD', KEYS[5], ARGV[5], ARGV[6])
return 1
