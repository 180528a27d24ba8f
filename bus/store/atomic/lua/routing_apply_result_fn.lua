-- Fragment (included, never run alone): apply_result(job, request, reply, flow_events, a, cur,
-- pushed).
-- The origin's side of a result. Arguments: the job copy, the request message, the reply list
-- that wakes the waiting client, the flow_events list; a: {status, result (JSON), reason,
-- stamp, request status, reply (JSON), reply TTL (s)}.
-- Effect: the job copy takes the final state, only if it is the request's (its message_key):
-- a refused message that named another message's job key is answered without touching that
-- job; the request takes its status; the reply is pushed (with its TTL); for a flow's job the
-- flow id is pushed on flow_events, which wakes the flow engine. cur: the job copy as
-- apply_result_job read it, if the caller read it already (nil: read here); pushed: the caller
-- pushed the reply already, with its TTL (routing_accept_results: its push is its check of the
-- list's type).
-- The pushes go through answers_push (runs_pushes): a batch of results pushes once per list.
-- include: stats_jobs
-- include: runs_pushes
-- one read, a pcall: a key of another type reads as an error, which is no request's job
local function apply_result_job(job)
  return redis.pcall('HMGET', job, 'message_key', 'flow_id', 'script_type', 'stats_queued_ms')
end
local function apply_result(job, request, reply, flow_events, a, cur, pushed)
  cur = cur or apply_result_job(job)
  local mine = not cur['err'] and cur[1] == request
  if mine then
    redis.call('HSET', job, 'status', a[1], 'result', a[2], 'reason', a[3], 'updated_at', a[4])
    stats_answered(job, a[1], a[3], {script_type = cur[3], stats_queued_ms = cur[4]})
  end
  redis.call('HSET', request, 'status', a[5], 'updated_at', a[4], 'processed_at', a[4])
  if not pushed then answers_push(reply, a[6], a[7]) end
  local flow = mine and cur[2]
  if flow and flow ~= '' then answers_push(flow_events, flow, false) end
end
