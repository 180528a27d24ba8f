-- Give an interrupted attempt back (shutdown): it does not count.
-- KEYS: job running inflight queue
-- ARGV: attempt now
-- Returns 1, or 0 if the attempt is not the job's current one (runs_fence: nothing written).
-- Atomic effect: the fence's release; attempt - 1, the job 'dispatched', its key pushed at the
-- consuming end of the queue; a probe's place freed (type_breaker). Lowering the attempt is safe for the fence: only the holder of
-- the current attempt gets here, and it has stopped its process.
-- include: type_breaker
-- include: runs_fence
redis.call('HINCRBY', KEYS[1], 'attempt', -1)
redis.call('HSET', KEYS[1], 'status', 'dispatched', 'updated_at', ARGV[2])
redis.call('RPUSH', KEYS[4], KEYS[1])
type_breaker_ended(KEYS[1], 'requeued', '', known)
return 1
