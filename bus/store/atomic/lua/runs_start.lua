-- Start an attempt on one job: the attempt number (the fencing token) goes up by one.
-- KEYS: job lease running
-- ARGV: token ttl_ms now runner_id [script_type: its breaker is consulted]
-- Returns a reason token if the job cannot be started (runs_unrunnable), {} if the job is
-- final, 'breaker_open:<ms>' if the breaker of script_type (when given) lets no job start for
-- that long, else the job's fields (flat) after the start.
-- Atomic effect: attempt + 1, status 'started' with runner/updated_at/runner_id, the lease
-- set to the token with a TTL, the job added to the running set (runs_begin); nothing written
-- on refusal.
-- include: runs_unrunnable
-- include: runs_begin
local bad, f = unrunnable(KEYS[1])
if bad then return bad end
if f['status'] == 'finished' or f['status'] == 'error' then return {} end
local gate, now_ms = ARGV[5] or '', stats_ms()  -- the start's stamp, the breaker's clock
if gate ~= '' then
  local wait = tb_wait(gate, now_ms)
  if wait > 0 then return 'breaker_open:' .. wait end
end
return begin(KEYS[1], f, ARGV[1], ARGV[2], ARGV[3], ARGV[4], KEYS[2], KEYS[3], gate, now_ms)
