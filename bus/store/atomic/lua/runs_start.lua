-- Start an attempt on one job: the attempt number (the fencing token) goes up by one.
-- KEYS: job lease running
-- ARGV: token ttl_ms now runner_id [script_type: its breaker is consulted]
-- Returns a reason token if the job cannot be started (runs_unrunnable), {} if the job is
-- final, 'breaker_open:<ms>' if the breaker of script_type (when given) lets no job start for
-- that long, else the job's fields (flat) after the start.
-- Atomic effect: attempt + 1, status 'started' with runner/updated_at/runner_id, the lease
-- set to the token with a TTL, the job added to the running set; nothing written on refusal.
-- include: runs_unrunnable
-- include: stats_jobs
-- include: type_breaker
local bad = unrunnable(KEYS[1])
if bad then return bad end
local st = redis.call('HGET', KEYS[1], 'status')
if st == 'finished' or st == 'error' then return {} end
local gate, now_ms = ARGV[5] or '', 0
if gate ~= '' then
  now_ms = tb_now()
  local wait = tb_wait(gate, now_ms)
  if wait > 0 then return 'breaker_open:' .. wait end
end
redis.call('HINCRBY', KEYS[1], 'attempt', 1)
redis.call('HSET', KEYS[1], 'status', 'started', 'runner', ARGV[1], 'updated_at', ARGV[3],
           'runner_id', ARGV[4])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[3], KEYS[1])
stats_started(KEYS[1])
if gate ~= '' then tb_started(gate, KEYS[1], now_ms) end
return redis.call('HGETALL', KEYS[1])
