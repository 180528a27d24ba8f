-- Fragment: the in-flight list's side of ending an attempt (runs_fence): local function
-- inflight_leave(list, job) takes the job's entry off its runner's in-flight list (one LREM).
-- A batch's ends (runs.ends_then_source) set inflight_batch to a table first: the entries are
-- then collected, and inflight_flush takes them off at once (inflight_ack: the list read once
-- and written once, not one LREM each, when three or more ended). The same entries leave
-- either way: the first occurrence of each, from the list's head. inflight_len(list): the
-- list's length, known without an LLEN when the flush just read it (a take that follows and
-- finds nothing queued returns it).
-- include: inflight_ack
local inflight_batch, inflight_known = false, false
local function inflight_leave(list, job)
  if not inflight_batch then
    redis.call('LREM', list, 1, job)
    return
  end
  inflight_batch.list = list
  inflight_batch.jobs[#inflight_batch.jobs + 1] = job
end
local function inflight_flush()
  local b = inflight_batch
  inflight_batch = false
  if not b or #b.jobs == 0 then return end
  local _, len = inflight_ack(b.list, b.jobs)
  if len then inflight_known = {list = b.list, len = len} end
end
local function inflight_len(list)
  local k = inflight_known
  if k and k.list == list then return k.len end
  return redis.call('LLEN', list)
end
