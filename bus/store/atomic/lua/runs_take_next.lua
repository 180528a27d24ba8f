-- Take the next queued jobs of a slot (up to count) and start them (run after a finish in one
-- round trip).
-- KEYS: inflight running, then the slot's lists in consume order
-- ARGV: token_base ttl_ms now runner_id [script_type: its breaker is consulted]
--       [count: take up to this many of what is queued now, 1 if absent] [counted: '1', the
--       caller counts the starts in its own sums (runs_begin)]
-- Returns {n} (nothing queued: n the in-flight list's length, which a blocking pop that
-- follows compares with its own: node/worker/loop.py; no LLEN when a batch's ends just read
-- it, runs_inflight), {key} (a final job's duplicate entry, dropped), {key, reason} (an entry
-- no runner can start: dropped, for the caller to dead-letter), {'', 'breaker_open:<ms>'} (the breaker of script_type lets no job start for
-- that long: nothing taken) or {key, fields...}; with a count above 1, what was taken as
-- {'*', entry, ...}, each entry one of {key}, {key, reason}, {key, fields...}.
-- Atomic effect: up to count entries (1 while the type's breaker is open or half-open: its
-- probes go one at a time) move from the first non-empty list to the in-flight list (taken
-- off it again when dropped); a started job is as after runs_start, its token
-- '<token_base>:<key>', its lease its score in the running zset. Only what is queued is taken:
-- nothing waits for a batch to fill. The batch's entries are pushed on the in-flight list in
-- one command, their leases in one ZADD (runs_leases), and the places its starts free in the
-- queue bounds written once (quota_depth).
-- include: runs_unrunnable
-- include: runs_begin
-- include: runs_inflight
local gate, now_ms = ARGV[5] or '', false
local count = tonumber(ARGV[6] or '1') or 1
local counted = ARGV[7] == '1'
-- only a breaker that opened needs the clock to say whether a job may start: a take that
-- finds nothing under a closed one (a runner going idle) reads no TIME
local b = gate ~= '' and tb_read(gate)
if b and b.opened then
  now_ms = stats_ms()
  local wait = tb_wait(gate, now_ms)
  if wait > 0 then return {'', 'breaker_open:' .. wait} end
  count = 1
end
-- one LMPOP over the slot's lists (empty ones cost nothing), then the in-flight pushes
local lists = {#KEYS - 2, unpack(KEYS, 3)}
lists[#lists + 1] = 'RIGHT'
if count > 1 then
  lists[#lists + 1] = 'COUNT'
  lists[#lists + 1] = count
end
local got = redis.call('LMPOP', unpack(lists))
if not got then return {inflight_len(KEYS[1])} end
-- what was taken is in flight at once (one LPUSH for the batch), until it is started or dropped
redis.call('LPUSH', KEYS[1], unpack(got[2]))
local function take(nxt)
  local bad, f = unrunnable(nxt)
  if bad then
    redis.call('LREM', KEYS[1], 1, nxt)
    return {nxt, bad}
  end
  if f['status'] == 'finished' or f['status'] == 'error' then
    redis.call('LREM', KEYS[1], 1, nxt)
    return {nxt}
  end
  local tok = ARGV[1] .. ':' .. nxt
  now_ms = now_ms or stats_ms()
  local out = begin(nxt, f, tok, ARGV[2], ARGV[3], ARGV[4], KEYS[2], gate, now_ms, counted)
  table.insert(out, 1, nxt)
  return out
end
if count == 1 then return quota_leave_all(function() return take(got[2][1]) end) end
return quota_leave_all(function()
  local taken = {'*'}
  leases_collect()
  for _, nxt in ipairs(got[2]) do taken[#taken + 1] = take(nxt) end
  leases_flush()
  return taken
end)
