-- Fragment: local function answer_here(job, request, reply_list, flow_events, status, now,
-- reply, ttl, counted, known). Answers a request made on this node (its origin's copy is the job itself, no
-- result message): the request's status ('processed' or 'error') and processed_at, the waiting
-- client's reply pushed on reply_list (which expires after ttl seconds), and the job's flow id
-- (if any) pushed on flow_events for the flow engine; the answer counted in the job statistics
-- unless the caller counted it (counted). known: the job's flow_id as the caller read it, or nil.
-- include: stats_jobs
local function answer_here(job, request, reply_list, flow_events, status, now, reply, ttl,
                           counted, known)
  local done = 'error'
  if status == 'finished' then done = 'processed' end
  redis.call('HSET', request, 'status', done, 'updated_at', now, 'processed_at', now)
  redis.call('LPUSH', reply_list, reply)
  if not counted then stats_answered(job, status, redis.call('HGET', job, 'reason')) end
  redis.call('EXPIRE', reply_list, ttl)
  local flow
  if known then flow = known.flow_id else flow = redis.call('HGET', job, 'flow_id') end
  if flow and flow ~= '' then redis.call('LPUSH', flow_events, flow) end
end
