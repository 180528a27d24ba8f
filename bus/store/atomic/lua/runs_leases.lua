-- Fragment: the running zset's side of starting and ending attempts (an attempt's lease is its
-- job's score there, when it lapses: runs.py). local function lease_take(running, due_ms, job)
-- sets the job's lease (one ZADD), lease_drop(running, job) takes it off (one ZREM).
-- After leases_collect(), until leases_flush(), they are collected instead, and the flush
-- writes them per zset at once: one ZREM of every lease dropped, then one ZADD of every lease
-- taken, in order (a job started twice keeps its last lease, as one ZADD each would leave it).
-- A batch is a take's starts (runs_take_next) or a batch's ends (runs.ends_then_source), each
-- flushed before the script goes on: nothing in between reads the zset.
-- include: chunked
-- include: batch_entry
local leases_batch = false
local function leases_new()
  return {add = {}, drop = {}}
end
local function lease_take(running, due_ms, job)
  if not leases_batch then
    redis.call('ZADD', running, due_ms, job)
    return
  end
  local add = batch_entry(leases_batch, running, leases_new).add
  add[#add + 1], add[#add + 2] = due_ms, job
end
local function lease_drop(running, job)
  if not leases_batch then
    redis.call('ZREM', running, job)
    return
  end
  local drop = batch_entry(leases_batch, running, leases_new).drop
  drop[#drop + 1] = job
end
local function leases_collect()
  leases_batch = {}
end
local function leases_flush()
  local batch = leases_batch
  leases_batch = false
  if not batch then return end
  for _, running in ipairs(batch) do
    local b = batch[running]
    call_chunked('ZREM', running, b.drop)
    call_chunked('ZADD', running, b.add)
  end
end
