-- End an attempt of a job submitted on this node and answer its client in the same step.
-- KEYS: job running inflight attempts request reply flow_events
-- ARGV: attempt status result reason now attempt_entry reply reply_ttl [stats: '' or absent,
--       this script counts the attempt in the job statistics; else a runner process's sums
--       (stats_apply), which count it]
-- Returns 1, or 0 if the attempt is not the job's current one (runs_fence: nothing written).
-- Atomic effect: the fence's release; the job's final state and attempt entry as runs_finish;
-- the request answered (runs_answer_here); the job's type breaker told (type_breaker); the
-- job statistics counted or the given sums applied.
-- include: runs_answer_here
-- include: stats_jobs
-- include: type_breaker
-- include: runs_fence
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'result', ARGV[3], 'reason', ARGV[4],
           'updated_at', ARGV[5])
if ARGV[6] ~= '' then redis.call('RPUSH', KEYS[4], ARGV[6]) end
local counted = (ARGV[9] or '') ~= ''
if counted then stats_apply(ARGV[9]) else stats_ended(KEYS[1], ARGV[2], ARGV[4], known) end
type_breaker_ended(KEYS[1], ARGV[2], ARGV[4], known)
answer_here(KEYS[1], KEYS[5], KEYS[6], KEYS[7], ARGV[2], ARGV[5], ARGV[7], ARGV[8], counted,
            known)
return 1
