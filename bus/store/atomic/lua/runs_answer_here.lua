-- Fragment: local function answer_here(job, request, reply_list, flow_events, status, now,
-- reply, ttl, counted, known). Answers a request made on this node (its origin's copy is the job
-- itself, no result message): the request's status ('processed' or 'error') and processed_at,
-- the waiting client's reply pushed on reply_list (which expires after ttl seconds), and the
-- job's flow id (if any) pushed on flow_events for the flow engine; the answer counted in the job
-- statistics unless the caller counted it (counted). known: the job's flow_id as the caller read
-- it, or nil. The pushes go through answers_push (runs_pushes): a batch's ends push once per list.
-- include: stats_jobs
-- include: runs_pushes
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
