-- Start an attempt on one job: the attempt number (the fencing token) goes up by one.
-- KEYS: job running
-- ARGV: token ttl_ms now runner_id [script_type: its breaker is consulted] [counted: '1', the
--       caller counts the start in its own sums (runs_begin)]
-- Returns a reason token if the job cannot be started (runs_unrunnable), {} if the job is
-- final, 'breaker_open:<ms>' if the breaker of script_type (when given) lets no job start for
-- that long, else the job's fields (flat) after the start.
-- Atomic effect: attempt + 1, status 'started' with runner/updated_at/runner_id, the job in
-- the running zset scored with its lease's expiry (runs_begin); nothing written on refusal.
-- include: runs_start_one
return start_one(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5] or '',
                 ARGV[6] == '1')
