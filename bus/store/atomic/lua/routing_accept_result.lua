-- Accept a verified result message at the origin.
-- KEYS: [1] the result message, [2] the replay hash, [3] the in-flight list, [4..7]
--       apply_result's keys (job copy, request, reply list, flow_events)
-- ARGV: [1..7] apply_result's values, [8] the replay window (s), [9] the result's key,
--       [10] its origin (the signer), [11] this node's id, [12] '1': the node counts the job
--       statistics (returned, not written: stats_collected), [13] its seen marker, [14] its
--       nonce marker ('' if none): fields of the replay hash
-- Returns: {'ok', '', counted} (what was counted if ARGV[12] asks, [field, increment, ...];
-- else empty), or {reason, detail} with nothing written: wrong_type (a key a result
-- updates holds another type), replay (of the message key or nonce), unknown_request,
-- late_result (the request already ended on a timeout), wrong_signer.
-- Atomic effect: the checks against what Valkey holds, then apply_result's writes, the result
-- message turns 'processed', its replay markers are set (TTL: the window) and it leaves the
-- in-flight list. Run in message order, a second copy in the same batch is a replay.
-- include: routing_apply_result_fn
-- include: replay_markers
-- keys a (signed, yet hostile) result names: one of another type is refused. The two hashes
-- are read anyway (pcalls: the error says another type); the lists are only written.
local function held(key)
  return {'wrong_type', key .. ' holds a ' .. redis.call('TYPE', key)['ok']}
end
local job = apply_result_job(KEYS[4])
if job['err'] then return held(KEYS[4]) end
local meta = redis.pcall('HMGET', KEYS[5], 'destination', 'status', 'reason')
if meta['err'] then return held(KEYS[5]) end
-- flow_events is written only for a flow's job that is the request's (apply_result)
local lists = {KEYS[6]}
if job[1] == KEYS[5] and job[2] and job[2] ~= '' then lists[2] = KEYS[7] end
for _, key in ipairs(lists) do
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= 'list' then return {'wrong_type', key .. ' holds a ' .. t} end
end
-- one HMGET of both markers
local markers = {ARGV[13]}
if ARGV[14] ~= '' then markers[2] = ARGV[14] end
local marked = replay_found(markers)
if marked[ARGV[13]] then return {'replay', 'message key'} end
if ARGV[14] ~= '' and marked[ARGV[14]] then return {'replay', 'nonce'} end
if not meta[1] then return {'unknown_request', ''} end
local why = meta[3] or ''
if meta[2] == 'error' and string.sub(why, 1, 8) == 'timeout_' then
  return {'late_result', why}
end
if ARGV[10] ~= meta[1] and ARGV[10] ~= ARGV[11] then return {'wrong_signer', ''} end
if ARGV[12] == '1' then stats_collected = {} end
apply_result(KEYS[4], KEYS[5], KEYS[6], KEYS[7], ARGV, job)
redis.call('HSET', KEYS[1], 'status', 'processed')
local flat = {ARGV[13], '1'}
if ARGV[14] ~= '' then flat[3], flat[4] = ARGV[14], ARGV[9] end
replay_mark(flat, ARGV[8])
redis.call('LREM', KEYS[3], 1, ARGV[9])
return {'ok', '', stats_collected or {}}
