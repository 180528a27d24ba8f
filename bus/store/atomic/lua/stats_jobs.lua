-- Fragment: local functions that keep the context's job statistics, the hash ${STATS_KEY}
-- (read by node/observe/metrics.py). It is not in KEYS: every script that starts or ends a job counts
-- it, whichever process runs it (the node, a runner process, the results service), and none of
-- their callers has to know. Both ends of a duration are stamped by the server's clock (TIME),
-- so node and runner processes never compare clocks.
-- Fields: submitted|<type>, received|<type>, started|<type>,
-- ended|<type>|<status>|<reason token> (status finished, error or retry; where the job ran),
-- answered|<type>|<status>|<reason token> (at the job's origin), and the histograms
-- duration|<type>|<le> and roundtrip|<type>|<le> (one count per bucket, not cumulative; le is
-- the first bucket bound the value is not above, or +Inf) with duration_sum|<type> and
-- roundtrip_sum|<type> (seconds). A job hash gains stats_queued_ms (when it was queued: on its
-- origin, submitted; at its destination, received) and stats_started_ms (its attempt's start).
-- A runner process counts the ends and answers of its attempts itself (bus/core/stats.py,
-- the same fields) and hands them to an ending script's 'stats' ARGV: stats_apply. Its slot's
-- totals are then the field runner|<slot id>, which readers add to the others.
local STATS = '${STATS_KEY}'
local STATS_BUCKETS = ${STATS_BUCKETS}
-- A script the node runs hands what it counts back to the node instead (it sets
-- stats_collected to a table and returns it: [field, increment, ...]), which adds it up in its
-- memory and writes its totals on a beat, one field (node/observe/jobstats.py).
-- Statistics never stop the transition that counts them: the runner user may write this hash,
-- and an increment on a field that holds no number (or one that is no whole number, or no
-- finite one) fails alone (pcall) while the script goes on.
local stats_collected = false
local function stats_add(field, n)
  if stats_collected then
    stats_collected[#stats_collected + 1] = field
    stats_collected[#stats_collected + 1] = tostring(n)
  elseif string.find(field, '_sum|', 1, true) then
    redis.pcall('HINCRBYFLOAT', STATS, field, n)
  else
    redis.pcall('HINCRBY', STATS, field, n)
  end
end
-- read once per script: a script is one instant, however many jobs it counts
local stats_now = false
local function stats_ms()
  if not stats_now then
    local t = redis.call('TIME')
    stats_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return stats_now
end
-- a reason's token (its text up to ': '): labels stay few whatever a runner writes
local function stats_token(text)
  return string.sub(string.match(text or '', '^[a-z0-9_]*'), 1, 40)
end
-- a job's script type (a [runners] name: letters, digits, '_', '.', '-'; never '|'), from
-- its script_type field t (or false)
local function stats_label(t)
  return string.sub(string.match(t or '', '^[%w_%.%-]*'), 1, 64)
end
local function stats_type(job)
  return stats_label(redis.call('HGET', job, 'script_type'))
end
local function stats_observe(name, stype, since_ms)
  local t0 = tonumber(since_ms)
  if not t0 then return end
  local s = math.max(0, stats_ms() - t0) / 1000
  local le = '+Inf'
  for _, b in ipairs(STATS_BUCKETS) do
    if s <= tonumber(b) then le = b; break end
  end
  stats_add(name .. '|' .. stype .. '|' .. le, 1)
  stats_add(name .. '_sum|' .. stype, s)
end
-- a job queued for the first time (a redelivery counts nothing), as event: 'submitted' at its
-- origin (its message names this node as both origin and destination, or the origin's copy),
-- else 'received'; fields: the job's fields as the script just wrote them (flat), where its
-- type is read
local function stats_count_queued(job, event, fields)
  local t = false
  for i = 1, #fields - 1, 2 do
    if fields[i] == 'script_type' then t = fields[i + 1] end
  end
  if not t then t = redis.call('HGET', job, 'script_type') end  -- a type written earlier
  stats_add(event .. '|' .. stats_label(t), 1)
end
local function stats_queued(job, event, fields)
  if redis.call('HSETNX', job, 'stats_queued_ms', stats_ms()) == 0 then return end
  stats_count_queued(job, event, fields)
end
local function stats_started(job)
  redis.call('HSET', job, 'stats_started_ms', stats_ms())
  stats_add('started|' .. stats_type(job), 1)
end
-- a job ended where it would run, no attempt running (a queued job stopped)
local function stats_ended_queued(job, status, reason)
  local stype = stats_type(job)
  local field = 'ended|' .. stype .. '|' .. stats_token(status) .. '|' .. stats_token(reason)
  stats_add(field, 1)
  return stype
end
-- an attempt ended where it ran (reason false: the job's own reason field; a retry's reason is
-- its cause, the failed attempt's reason); known: the job's script_type and stats_started_ms as
-- the caller read them (runs_fence), or nil
local function stats_ended(job, status, reason, known)
  reason = reason or redis.call('HGET', job, 'reason') or ''
  local stype, since
  if known then
    stype, since = stats_label(known.script_type), known.stats_started_ms
  else
    stype, since = stats_type(job), redis.call('HGET', job, 'stats_started_ms')
  end
  local field = 'ended|' .. stype .. '|' .. stats_token(status) .. '|' .. stats_token(reason)
  stats_add(field, 1)
  stats_observe('duration', stype, since)
end
-- a job answered at its origin (its copy there, or the job itself if it ran there)
-- (known: the job's script_type and stats_queued_ms as the caller read them, or nil)
local function stats_answered(job, status, reason, known)
  local stype, since
  if known then
    stype, since = stats_label(known.script_type), known.stats_queued_ms
  else
    stype, since = stats_type(job), redis.call('HGET', job, 'stats_queued_ms')
  end
  local field = 'answered|' .. stype .. '|' .. stats_token(status) .. '|' .. stats_token(reason)
  stats_add(field, 1)
  stats_observe('roundtrip', stype, since)
end
-- what a runner process counted (bus/core/stats.py): its slot's totals,
-- '=runner|<slot id>' TAB a JSON object, set in one HSET (a reader adds them: merged_fields);
-- or increments, a JSON list [field, increment, ...] (a '_sum|' field is a float)
local function stats_apply(encoded)
  if string.byte(encoded, 1) == 61 then  -- '='
    local tab = string.find(encoded, '\t', 2, true)
    if tab then
      redis.pcall('HSET', STATS, string.sub(encoded, 2, tab - 1), string.sub(encoded, tab + 1))
    end
    return
  end
  local ok, flat = pcall(cjson.decode, encoded)  -- what no runner writes is skipped, whole
  if not ok or type(flat) ~= 'table' then return end
  for i = 1, #flat - 1, 2 do
    local n = tonumber(flat[i + 1])
    if type(flat[i]) == 'string' and n then stats_add(flat[i], n) end
  end
end
