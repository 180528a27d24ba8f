-- End an attempt whose job hash cannot be run (the caller dead-letters it).
-- KEYS: job running inflight
-- ARGV: attempt reason now
-- Returns 1, or 0 if the attempt is not the job's current one (runs_fence: nothing written).
-- Atomic effect: the fence's release; the job 'error' with the reason (no verdict on its type:
-- a probe's place is freed).
-- include: stats_jobs
-- include: type_breaker
-- include: runs_fence
redis.call('HSET', KEYS[1], 'status', 'error', 'reason', ARGV[2], 'updated_at', ARGV[3])
stats_ended(KEYS[1], 'error', ARGV[2], known)
type_breaker_ended(KEYS[1], 'error', ARGV[2], known)
return 1
