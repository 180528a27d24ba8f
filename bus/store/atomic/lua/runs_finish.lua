-- End an attempt with its final state and queue the signed answer for its origin.
-- KEYS: job running inflight attempts answer msg_out
-- ARGV: attempt status result reason now attempt_entry stats answer-fields... (stats: '', this
--       script counts the attempt in the job statistics; else a runner process's sums,
--       stats_apply, which count it)
-- Returns 1, or 0 if the attempt is not the job's current one (runs_fence: nothing written).
-- Atomic effect: the fence's release; status/result/reason/updated_at on the job, the attempt
-- entry appended to the attempts list (unless '': a first attempt that finished records none,
-- runs.attempt_entry), the answer message hash written and its key pushed on
-- msg_out (with a batch's other answers, in one push: runs_pushes); the job's type breaker told (type_breaker); the job statistics counted or the
-- given sums applied.
-- include: stats_jobs
-- include: type_breaker
-- include: runs_pushes
-- include: runs_fence
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'result', ARGV[3], 'reason', ARGV[4],
           'updated_at', ARGV[5])
if ARGV[6] ~= '' then redis.call('RPUSH', KEYS[4], ARGV[6]) end
if ARGV[7] ~= '' then
  stats_apply(ARGV[7])
else
  stats_ended(KEYS[1], ARGV[2], ARGV[4], known)
end
type_breaker_ended(KEYS[1], ARGV[2], ARGV[4], known)
redis.call('HSET', KEYS[5], unpack(ARGV, 8))
answers_push(KEYS[6], KEYS[5], false)
return 1
