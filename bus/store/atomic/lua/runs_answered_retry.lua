-- Results service: an external runner's failed attempt with retries left is retried later.
-- KEYS: job results_inflight attempts delayed
-- ARGV: now status entry attempt cause due_ms member ('<queue>|<job key>'); cause: the failed
--       attempt's reason
-- Returns 1, or 0 if already answered or changed since read (runs_answered).
-- Atomic effect: runs_answered's; the job 'dispatched', its reason the cause and its retry_of
-- the attempt, the member added to the delayed zset at due_ms.
-- include: stats_jobs
-- include: runs_answered
-- an external runner starts jobs by hand: its job leaves its actor's queued count here
-- include: quota_depth
redis.call('HSET', KEYS[1], 'status', 'dispatched', 'reason', ARGV[5], 'retry_of', ARGV[4],
           'updated_at', ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[6], ARGV[7])
stats_ended(KEYS[1], 'retry', ARGV[5])
quota_left(KEYS[1])
return 1
