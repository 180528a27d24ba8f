-- Fragment: local function answer_here(job, request, reply_list, flow_events, status, now,
-- reply, ttl, counted, known). Answers a request made on this node (its origin's copy is the job itself, no
-- result message): the request's status ('processed' or 'error') and processed_at, the waiting
-- client's reply pushed on reply_list (which expires after ttl seconds), and the job's flow id
-- (if any) pushed on flow_events for the flow engine; the answer counted in the job statistics
-- unless the caller counted it (counted). known: the job's flow_id as the caller read it, or nil.
-- While answers_batch is a table (a batch's ends: runs.ends_then_source), the pushes are
-- collected and answers_flush makes them per list: one LPUSH of all a reply list's (or
-- inbox's) replies and one EXPIRE, one LPUSH of the flow ids; each list gets its entries in
-- the same order as one push each would give.
-- include: stats_jobs
local answers_batch = false
local function answers_push(list, value, ttl)
  if not answers_batch then
    redis.call('LPUSH', list, value)
    if ttl then redis.call('EXPIRE', list, ttl) end
    return
  end
  local b = answers_batch[list]
  if not b then
    b = {values = {}}
    answers_batch[list] = b
    answers_batch[#answers_batch + 1] = list
  end
  b.values[#b.values + 1] = value
  b.ttl = ttl or b.ttl
end
local function answers_flush()
  local batch = answers_batch
  answers_batch = false
  if not batch then return end
  for _, list in ipairs(batch) do
    local b = batch[list]
    redis.call('LPUSH', list, unpack(b.values))
    if b.ttl then redis.call('EXPIRE', list, b.ttl) end
  end
end
local function answer_here(job, request, reply_list, flow_events, status, now, reply, ttl,
                           counted, known)
  local done = 'error'
  if status == 'finished' then done = 'processed' end
  redis.call('HSET', request, 'status', done, 'updated_at', now, 'processed_at', now)
  answers_push(reply_list, reply, ttl)
  if not counted then stats_answered(job, status, redis.call('HGET', job, 'reason')) end
  local flow
  if known then flow = known.flow_id else flow = redis.call('HGET', job, 'flow_id') end
  if flow and flow ~= '' then answers_push(flow_events, flow, false) end
end
