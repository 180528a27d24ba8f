-- Fragment: local function begin(job, f, token, ttl_ms, now, runner_id, running, gate, now_ms,
-- counted), for the scripts that start a job (after unrunnable said it may start).
-- f: the job's fields as unrunnable read them. Starts the attempt: attempt + 1 (the fencing
-- token), status 'started' with runner/updated_at/runner_id and stats_started_ms (now_ms), the
-- job in the running zset with its lease's expiry (now_ms + ttl_ms: the lease is its score, the
-- token its runner field; runs_leases: a take's starts set theirs at once), counted as started
-- (unless counted: a runner process counts its starts in its own sums, bus/core/stats.py,
-- and hands them over with its ends), a probe of its type's breaker (gate, if given) marked, a
-- retry it was waiting for (retry_of) cleared, the job no longer counted as queued for its actor's queue bound (quota_depth: its
-- mark '0' in the same HSET).
-- Returns the job's fields after the start (flat), from f: the hash is not read again.
-- include: stats_jobs
-- include: type_breaker
-- include: quota_depth
-- include: runs_leases
local function begin(job, f, token, ttl_ms, now, runner_id, running, gate, now_ms, counted)
  f['attempt'] = tostring((tonumber(f['attempt']) or 0) + 1)
  f['status'], f['runner'], f['updated_at'], f['runner_id'] = 'started', token, now, runner_id
  f['stats_started_ms'] = tostring(now_ms)
  local w = {'attempt', f['attempt'], 'status', 'started', 'runner', token, 'updated_at', now,
             'runner_id', runner_id, 'stats_started_ms', f['stats_started_ms']}
  if quota_started(f) then  -- it leaves its actor's count: its mark turns '0' in the same write
    quota_left(job, f)
    w[#w + 1], w[#w + 2] = '${QUOTA_COUNTED}', '0'
    f['${QUOTA_COUNTED}'] = '0'
  end
  redis.call('HSET', job, unpack(w))
  if f['retry_of'] then  -- only a retried job pays this command
    redis.call('HDEL', job, 'retry_of')
    f['retry_of'] = nil
  end
  lease_take(running, now_ms + tonumber(ttl_ms), job)
  if not counted then stats_add('started|' .. stats_label(f['script_type']), 1) end
  if gate ~= '' and tb_started(gate, job, now_ms) then f['breaker_probe'] = '1' end
  local out = {}
  for k, v in pairs(f) do
    out[#out + 1] = k
    out[#out + 1] = v
  end
  return out
end
