-- Fragment: local functions that keep the queue depths admission bounds (node/intake/admission.py),
-- data model v3: the hash ${QUOTA_DEPTH_KEY} of each actor's count of jobs queued and not started
-- yet (field: the actor id); the context's depth is the sum of its values. Not in KEYS, as the
-- job statistics: the scripts that queue, start or stop a job keep them, whichever process runs
-- them. A counted job holds the field ${QUOTA_COUNTED} = '1' in its own hash, and '0' (or none)
-- once it left its queue: a job counts once however often it is queued or started, so a
-- redelivery or a second start never moves a count twice, and the mark costs no command where
-- the job is queued or started (it rides in the job's own HSET there).
-- The actor of a job key job:<actor>:<id> (false for any other key: counted nowhere).
-- include: chunked
local function quota_actor(job)
  return string.match(job, '^job:(%d+):%d+$') or false
end
-- job left its queue (started, or stopped while queued): no longer counted. One HGET, and one
-- HDEL and one HINCRBY when it was counted. While an actor has jobs waiting past its fair share
-- (quota_push), a place freed in the queues is an event: one entry on ${QUOTA_WAKE_KEY} (never
-- more), which the node's run_fair_share blocks on and answers with quota_refill.lua. One SCARD
-- otherwise. f: the job's fields if the caller read them, and then the caller's own HSET of the
-- job writes the mark '0' when f holds '1' (quota_started: no command for the mark), or nil.
-- While quota_leaving is a table (a take that starts several jobs: quota_leave_all), the
-- counts are collected there and written once for the batch.
local quota_leaving = false
-- the wake-up's one entry: the LPUSH's reply is the list's length, trimmed back to one only
-- when an entry was there already (most often the node took it: one command, not two)
local function quota_wake()
  if redis.call('LPUSH', '${QUOTA_WAKE_KEY}', '1') > 1 then
    redis.call('LTRIM', '${QUOTA_WAKE_KEY}', 0, 0)
  end
end
local function quota_freed(counts)
  for actor, n in pairs(counts) do redis.call('HINCRBY', '${QUOTA_DEPTH_KEY}', actor, -n) end
  if redis.call('SCARD', '${QUOTA_WAITING_KEY}') > 0 then quota_wake() end
end
local function quota_started(f)
  return f['${QUOTA_COUNTED}'] == '1'
end
local function quota_left(job, f)
  if f then
    if not quota_started(f) then return end
  else
    if redis.call('HGET', job, '${QUOTA_COUNTED}') ~= '1' then return end
    redis.call('HDEL', job, '${QUOTA_COUNTED}')
  end
  local actor = quota_actor(job)
  if not quota_leaving then
    quota_freed(actor and {[actor] = 1} or {})
    return
  end
  quota_leaving.freed = true
  if actor then quota_leaving.counts[actor] = (quota_leaving.counts[actor] or 0) + 1 end
end
-- run(): a take's starts, whose freed places are written once (one HINCRBY per actor, one SCARD)
local function quota_leave_all(run)
  quota_leaving = {counts = {}, freed = false}
  local out = run()
  local batch = quota_leaving
  quota_leaving = false
  if batch.freed then quota_freed(batch.counts) end
  return out
end
-- A batch that queues jobs (queues_materialise) counts them in this table and writes the counts
-- once, one HINCRBY per actor (quota_flush); the depths it checks bounds against are read only
-- when a bound asks: once per actor (quota_mine), or, when the context's depth is asked too
-- (quota_batch.whole: the context has a bound), the whole hash once, which gives every actor's
-- and their sum (quota_all; the script's own counts wait for quota_flush, so both reads agree).
local quota_batch = {added = {}, mine = {}, all = false, whole = false}
local function quota_all()
  local b = quota_batch
  if not b.all then
    local sum, flat = 0, redis.call('HGETALL', '${QUOTA_DEPTH_KEY}')
    for i = 1, #flat - 1, 2 do
      local n = tonumber(flat[i + 1]) or 0
      sum = sum + n
      if b.mine[flat[i]] == nil then b.mine[flat[i]] = n end
    end
    b.all = {sum}
  end
  local n = b.all[1]
  for _, v in pairs(b.added) do n = n + v end
  return n
end
-- job (written with its mark, or marked by HSETNX: new_mark) counts for its actor
local function quota_mine(actor)
  local b = quota_batch
  if b.mine[actor] == nil and b.whole then quota_all() end
  if b.mine[actor] == nil then
    -- read whole, the hash holds no field for this actor: 0
    b.mine[actor] = b.all and 0 or tonumber(redis.call('HGET', '${QUOTA_DEPTH_KEY}', actor)) or 0
  end
  return b.mine[actor] + (b.added[actor] or 0)
end
local function quota_add(job, new_mark)
  local actor = quota_actor(job)
  if actor and new_mark then quota_batch.added[actor] = (quota_batch.added[actor] or 0) + 1 end
end
-- Fair share (queues_materialise): an actor holds at most quota_batch.fair (0: no bound) of its
-- jobs in the context's queues; the rest wait, oldest at the right, in its list
-- ${QUOTA_WAIT_PREFIX}<actor> as "<queue> <job key>" entries (one list keeps its order across
-- queues). Jobs held in the queues = its count (quota_mine: queued and not started) less its
-- waiting list's length, so no counter of its own, and a waiting job counts against the queue
-- bounds like any job not started: the bounds stay exact. One LLEN per actor and batch.
quota_batch.fair, quota_batch.waits, quota_batch.wait_order = 0, {}, {}
local function quota_waits(actor)
  local w = quota_batch.waits[actor]
  if not w then
    w = {len = redis.call('LLEN', '${QUOTA_WAIT_PREFIX}' .. actor), entries = {}}
    quota_batch.waits[actor] = w
    quota_batch.wait_order[#quota_batch.wait_order + 1] = actor
  end
  return w
end
-- true: job (counted already: quota_add) goes on queue now; false: it waits (written by
-- quota_flush). An actor with jobs waiting has its new ones wait behind them: its order holds.
local function quota_push(queue, job)
  local actor = quota_actor(job)
  if quota_batch.fair <= 0 or not actor then return true end
  local w = quota_waits(actor)
  local waiting = w.len + #w.entries
  if waiting == 0 and quota_mine(actor) <= quota_batch.fair then return true end
  w.entries[#w.entries + 1] = queue .. ' ' .. job
  return false
end
local function quota_flush()
  for actor, n in pairs(quota_batch.added) do
    if n ~= 0 then redis.call('HINCRBY', '${QUOTA_DEPTH_KEY}', actor, n) end
  end
  quota_batch.added = {}
  for _, actor in ipairs(quota_batch.wait_order) do
    local entries = quota_batch.waits[actor].entries
    call_chunked('LPUSH', '${QUOTA_WAIT_PREFIX}' .. actor, entries)
    if #entries > 0 then redis.call('SADD', '${QUOTA_WAITING_KEY}', actor) end
  end
  quota_batch.waits, quota_batch.wait_order = {}, {}
end
-- A stop of a queued job found nowhere in its queue: it may wait in its actor's list. One LRANGE
-- of that list, for stops only (a start never looks there). True if it was there.
local function quota_unwait(job)
  local actor = quota_actor(job)
  if not actor then return false end
  local list = '${QUOTA_WAIT_PREFIX}' .. actor
  local tail = ' ' .. job
  for _, e in ipairs(redis.call('LRANGE', list, 0, -1)) do
    if string.sub(e, -#tail) == tail then
      redis.call('LREM', list, 0, e)
      if redis.call('LLEN', list) == 0 then redis.call('SREM', '${QUOTA_WAITING_KEY}', actor) end
      return true
    end
  end
  return false
end
