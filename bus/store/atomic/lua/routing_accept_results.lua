-- Accept a batch of verified result messages at the origin.
-- KEYS: [1] the replay hash, [2] the in-flight list
-- ARGV: [1] the batch as JSON, in message order: [{key (the result message), seen, nonce (its
--       replay markers, fields of the replay hash; nonce '' if none), origin (the signer),
--       keys: apply_result's keys [job copy, request, reply list, flow_events], args:
--       apply_result's seven values}], [2] the replay window (s), [3] this node's id,
--       [4] '1': the node counts the job statistics (returned, not written: stats_collected)
-- Returns: {verdicts, counted}: per result {'ok', ''}, or {reason, detail} with nothing of it
-- written: wrong_type (a key a result updates holds another type), replay (of the message key
-- or nonce), unknown_request, late_result (the request already ended on a timeout),
-- wrong_signer; and what was counted if ARGV[4] asks ([field, increment, ...]; else empty).
-- Atomic effect: per result in order, the checks against what Valkey holds, then apply_result's
-- writes and the result message turns 'processed'; a second copy in the same batch is a
-- replay. Then, once for the batch, the replies and flow events are pushed (one LPUSH and one
-- EXPIRE per list, behind each reply list's first push: runs_pushes), the accepted results'
-- replay markers are set (TTL: the window) and they leave the in-flight list (refused ones stay
-- for their dead letters).
-- include: routing_apply_result_fn
-- include: replay_markers
-- include: inflight_ack
local batch = cjson.decode(ARGV[1])
if ARGV[4] == '1' then stats_collected = {} end
answers_batch = {}  -- the pushes per list at once (runs_pushes)
local names = {}
for _, r in ipairs(batch) do
  names[#names + 1] = r.seen
  if r.nonce ~= '' then names[#names + 1] = r.nonce end
end
local marked = replay_found(names)
-- keys a (signed, yet hostile) result names: one of another type is refused. The two hashes
-- are read anyway (pcalls: the error says another type); flow_events (only a flow's result
-- writes it) by its TYPE, and the reply list by the result's first write, its push (a pcall,
-- once every other check passed: refused, nothing of the result is written).
local function held(key)
  return {'wrong_type', key .. ' holds a ' .. redis.call('TYPE', key)['ok']}
end
local function accept(r)
  local k = r.keys
  local job = apply_result_job(k[1])
  if job['err'] then return held(k[1]) end
  local meta = redis.pcall('HMGET', k[2], 'destination', 'status', 'reason')
  if meta['err'] then return held(k[2]) end
  -- flow_events is written only for a flow's job that is the request's (apply_result)
  if job[1] == k[2] and job[2] and job[2] ~= '' then
    local t = redis.call('TYPE', k[4])['ok']
    if t ~= 'none' and t ~= 'list' then return {'wrong_type', k[4] .. ' holds a ' .. t} end
  end
  if marked[r.seen] then return {'replay', 'message key'} end
  if r.nonce ~= '' and marked[r.nonce] then return {'replay', 'nonce'} end
  if not meta[1] then return {'unknown_request', ''} end
  local why = meta[3] or ''
  if meta[2] == 'error' and string.sub(why, 1, 8) == 'timeout_' then
    return {'late_result', why}
  end
  if r.origin ~= meta[1] and r.origin ~= ARGV[3] then return {'wrong_signer', ''} end
  -- the batch's first push on a reply list checks its type; the list's later ones wait for the
  -- flush, behind it
  if answers_batch[k[3]] then
    answers_push(k[3], r.args[6], r.args[7])
  elseif not answers_first(k[3], r.args[6], r.args[7]) then
    return held(k[3])
  end
  apply_result(k[1], k[2], k[3], k[4], r.args, job, true)
  -- a pcall: the batch's later writes must not hang on a message key turned into another
  -- type under us (nothing else here can fail)
  redis.pcall('HSET', r.key, 'status', 'processed')
  return {'ok', ''}
end
local verdicts, markers, acked = {}, {}, {}
for i, r in ipairs(batch) do
  verdicts[i] = accept(r)
  if verdicts[i][1] == 'ok' then
    replay_note(markers, marked, r.seen, r.nonce, r.key)
    acked[#acked + 1] = r.key
  end
end
answers_flush()
replay_mark(markers, ARGV[2])
inflight_ack(KEYS[2], acked)
return {verdicts, stats_collected or {}}
