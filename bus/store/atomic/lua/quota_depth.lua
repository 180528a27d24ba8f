-- Fragment: local functions that keep the queue depths admission bounds (node/intake/admission.py),
-- data model v3: the hash ${QUOTA_DEPTH_KEY} of each actor's count of jobs queued and not started
-- yet (field: the actor id); the context's depth is the sum of its values. Not in KEYS, as the
-- job statistics: the scripts that queue, start or stop a job keep them, whichever process runs
-- them. A counted job holds the field ${QUOTA_COUNTED} in its own hash: a job counts once however
-- often it is queued or started, so a redelivery or a second start never moves a count twice,
-- and the mark costs no command where the job is queued (it rides in the job's own HSET).
-- The actor of a job key job:<actor>:<id> (false for any other key: counted nowhere).
local function quota_actor(job)
  return string.match(job, '^job:(%d+):%d+$') or false
end
-- job left its queue (started, or stopped while queued): no longer counted. One HDEL, and one
-- HINCRBY when it was counted.
local function quota_left(job)
  if redis.call('HDEL', job, '${QUOTA_COUNTED}') == 1 then
    local actor = quota_actor(job)
    if actor then redis.call('HINCRBY', '${QUOTA_DEPTH_KEY}', actor, -1) end
  end
end
-- A batch that queues jobs (routing_materialise) counts them in this table and writes the counts
-- once, one HINCRBY per actor (quota_flush); the depths it checks bounds against are read once
-- per actor and once for the context, only when a bound asks (quota_mine, quota_all).
local quota_batch = {added = {}, mine = {}, all = false}
local function quota_mine(actor)
  local b = quota_batch
  if b.mine[actor] == nil then
    b.mine[actor] = tonumber(redis.call('HGET', '${QUOTA_DEPTH_KEY}', actor)) or 0
  end
  return b.mine[actor] + (b.added[actor] or 0)
end
local function quota_all()
  local b = quota_batch
  if not b.all then
    local sum = 0
    for _, v in ipairs(redis.call('HVALS', '${QUOTA_DEPTH_KEY}')) do sum = sum + (tonumber(v) or 0) end
    b.all = {sum}
  end
  local n = b.all[1]
  for _, v in pairs(b.added) do n = n + v end
  return n
end
-- job (written with its mark, or marked by HSETNX: new_mark) counts for its actor
local function quota_add(job, new_mark)
  local actor = quota_actor(job)
  if actor and new_mark then quota_batch.added[actor] = (quota_batch.added[actor] or 0) + 1 end
end
local function quota_flush()
  for actor, n in pairs(quota_batch.added) do
    if n ~= 0 then redis.call('HINCRBY', '${QUOTA_DEPTH_KEY}', actor, n) end
  end
  quota_batch.added = {}
end
