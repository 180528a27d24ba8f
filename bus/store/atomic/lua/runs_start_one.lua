-- Fragment: local function start_one(job, running, token, ttl_ms, now, runner_id, gate,
-- counted), for the scripts that start one popped entry (runs_start, runs_start_moved). Returns
-- a reason token if the entry names nothing a runner can start (runs_unrunnable), {} if the job
-- is final, 'breaker_open:<ms>' if the breaker of the script type ``gate`` (when not '') lets no
-- job start for that long, else the job's fields (flat) after the start (runs_begin: attempt
-- + 1, status 'started', the lease in the running zset; the start counted unless counted).
-- Nothing written on refusal.
-- include: runs_unrunnable
-- include: runs_begin
local function start_one(job, running, token, ttl_ms, now, runner_id, gate, counted)
  local bad, f = unrunnable(job)
  if bad then return bad end
  if f['status'] == 'finished' or f['status'] == 'error' then return {} end
  local now_ms = stats_ms()  -- the start's stamp, the breaker's clock, the lease's base
  if gate ~= '' then
    local wait = tb_wait(gate, now_ms)
    if wait > 0 then return 'breaker_open:' .. wait end
  end
  return begin(job, f, token, ttl_ms, now, runner_id, running, gate, now_ms, counted)
end
