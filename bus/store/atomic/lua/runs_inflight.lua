-- Fragment: the in-flight list's side of ending an attempt (runs_fence): local function
-- inflight_leave(list, job) takes the job's entry off its runner's in-flight list (one LREM).
-- A batch's ends (runs.ends_then_source) set inflight_batch to a table first: the entries are
-- then collected, and inflight_flush takes them off at once: the list read once and written
-- once (LRANGE, DEL, and RPUSH of what stays), not one LREM each, when three or more ended.
-- The same entries leave either way: the first occurrence of each, from the list's head.
local inflight_batch = false
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
  if #b.jobs < 3 then
    for _, job in ipairs(b.jobs) do redis.call('LREM', b.list, 1, job) end
    return
  end
  local gone = {}
  for _, job in ipairs(b.jobs) do gone[job] = (gone[job] or 0) + 1 end
  local stay = {}
  for _, entry in ipairs(redis.call('LRANGE', b.list, 0, -1)) do
    if (gone[entry] or 0) > 0 then
      gone[entry] = gone[entry] - 1
    else
      stay[#stay + 1] = entry
    end
  end
  redis.call('DEL', b.list)
  for i = 1, #stay, 1000 do
    redis.call('RPUSH', b.list, unpack(stay, i, math.min(i + 999, #stay)))
  end
end
