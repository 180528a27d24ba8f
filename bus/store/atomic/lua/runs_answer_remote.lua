-- Results service: answer an external runner's final job whose request came from another node.
-- KEYS: job results_inflight attempts answer msg_out
-- ARGV: now status entry attempt result answer-fields...
-- Returns 1, or 0 if already answered or changed since read (runs_answered).
-- Atomic effect: runs_answered's; the job marked answered (at now) with the result, the
-- signed result message hash written and its key pushed on msg_out.
-- include: stats_jobs
-- include: runs_answered
-- an external runner starts jobs by hand: its job leaves its actor's queued count here
-- include: quota_depth
redis.call('HSET', KEYS[1], 'answered', ARGV[1], 'result', ARGV[5])
redis.call('HSET', KEYS[4], unpack(ARGV, 6))
redis.call('LPUSH', KEYS[5], KEYS[4])
stats_ended(KEYS[1], ARGV[2], false)
quota_left(KEYS[1])
return 1
