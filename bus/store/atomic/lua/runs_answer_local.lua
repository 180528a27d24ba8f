-- Results service: answer an external runner's final job whose request was made on this node.
-- KEYS: job results_inflight attempts request reply flow_events
-- ARGV: now status entry attempt result reply reply_ttl
-- Returns 1, or 0 if already answered or changed since read (runs_answered).
-- Atomic effect: runs_answered's; the job marked answered (at now) with the result, the request
-- answered (runs_answer_here).
-- include: runs_answer_here
-- include: stats_jobs
-- include: runs_answered
-- an external runner starts jobs by hand: its job leaves its actor's queued count here
-- include: quota_depth
redis.call('HSET', KEYS[1], 'answered', ARGV[1], 'result', ARGV[5])
answer_here(KEYS[1], KEYS[4], KEYS[5], KEYS[6], ARGV[2], ARGV[1], ARGV[6], ARGV[7], false)
stats_ended(KEYS[1], ARGV[2], false)
quota_left(KEYS[1])
return 1
