-- Fragment: local functions of the circuit breaker of each script type of a context, the hash
-- ${TYPE_BREAKERS_KEY} (bus/store/atomic/type_breakers.py reads it). The state machine is
-- bus/core/breaker.py's, transcribed (tests/runners/test_type_breaker.py replays random events
-- through both). It is not in KEYS, like the job statistics: every script that starts or ends
-- a job keeps it, whichever process runs it, and their callers need not know.
-- Fields per type t: t|cfg ('<threshold>,<open_ms>,<probes>', written by the type's runner
-- processes; absent or threshold 0: no breaker), t|failures (in a row), t|opened_ms (when it
-- last opened, '' while closed), t|probing (probes under way). A probe job carries the field
-- breaker_probe until its attempt ends. Times are Valkey's clock (TIME): the processes that
-- share a breaker then share its clock too.
local TB = '${TYPE_BREAKERS_KEY}'
local TB_NEUTRAL = ${BREAKER_NEUTRAL}
-- read once per script, and only by a script that has a breaker to judge
local tb_clock = false
local function tb_now()
  if not tb_clock then
    local t = redis.call('TIME')
    tb_clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return tb_clock
end
-- the breaker of type t, or nil if t has none
-- read once per script and type (a start asks tb_wait, then tb_started): every change goes
-- through tb_write, which keeps this copy in step
local tb_seen = {}
local function tb_read(t)
  if tb_seen[t] ~= nil then return tb_seen[t] or nil end
  local v = redis.call('HMGET', TB, t .. '|cfg', t .. '|failures', t .. '|opened_ms',
                       t .. '|probing')
  local th, op, pr = string.match(v[1] or '', '^(%d+),(%d+),(%d+)$')
  if not th or tonumber(th) < 1 then
    tb_seen[t] = false
    return nil
  end
  tb_seen[t] = {threshold = tonumber(th), open_ms = tonumber(op),
                probes = math.max(1, tonumber(pr)), failures = tonumber(v[2]) or 0,
                opened = tonumber(v[3] or ''), probing = tonumber(v[4]) or 0}
  return tb_seen[t]
end
local function tb_write(t, b)
  redis.call('HSET', TB, t .. '|failures', b.failures, t .. '|opened_ms', b.opened or '',
             t .. '|probing', b.probing)
  tb_seen[t] = b
end
local function tb_state(b, now)
  if not b.opened then return 'closed' end
  if now < b.opened + b.open_ms then return 'open' end
  return 'half_open'
end
-- how long (ms) a job of type t must wait before it may start: 0 now; while open, until the
-- cool-down ends; half-open with every probe out, a second (or the cool-down if shorter)
local function tb_wait(t, now)
  local b = tb_read(t)
  if not b then return 0 end
  local st = tb_state(b, now)
  if st == 'closed' then return 0 end
  if st == 'open' then return b.opened + b.open_ms - now end
  if b.probing < b.probes then return 0 end
  return math.max(1, math.min(1000, b.open_ms))
end
-- a job of type t started (after tb_wait said 0): half-open, it is a probe (returns true)
local function tb_started(t, job, now)
  local b = tb_read(t)
  if not b or tb_state(b, now) ~= 'half_open' then return false end
  b.probing = b.probing + 1
  tb_write(t, b)
  redis.call('HSET', job, 'breaker_probe', '1')
  return true
end
-- one event on type t's breaker ('ok', 'fail' or 'release'), as Breaker's methods, at now (nil:
-- Valkey's clock, read only if the event needs it); a success of a closed breaker with no
-- failure changes nothing and writes nothing (the common case: no write per job)
local function tb_event(t, event, now)
  local b = tb_read(t)
  if not b then return end
  if event == 'ok' and b.failures == 0 and not b.opened and b.probing == 0 then return end
  if event == 'ok' then
    b.failures, b.opened, b.probing = 0, nil, 0
  elseif event == 'fail' then
    now = now or tb_now()
    local st = tb_state(b, now)
    b.failures = b.failures + 1
    if st == 'half_open' or (st == 'closed' and b.failures >= b.threshold) then
      b.opened, b.probing = now, 0
    end
  else
    b.probing = math.max(0, b.probing - 1)
  end
  tb_write(t, b)
end
-- an attempt of job ended with status ('finished', 'error', 'retry' or 'requeued') and reason:
-- finished closes its type's breaker, a failure counts (any error but a refusal or a stop:
-- see BREAKER_NEUTRAL), anything else only frees the job's probe, if it was one. known: the
-- job's script_type and breaker_probe fields as the caller read them (runs_fence).
local function type_breaker_ended(job, status, reason, known)
  local t = string.sub(string.match(known.script_type or '', '^[%w_%.%-]*'), 1, 64)
  local probe = known.breaker_probe
  if probe then redis.call('HDEL', job, 'breaker_probe') end
  local token = string.match(reason or '', '^[a-z0-9_]*')
  if status == 'finished' then
    tb_event(t, 'ok', nil)
  elseif (status == 'error' or status == 'retry') and not TB_NEUTRAL[token] then
    tb_event(t, 'fail', nil)
  elseif probe then
    tb_event(t, 'release', nil)
  end
end
