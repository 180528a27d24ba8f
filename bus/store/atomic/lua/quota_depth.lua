-- Fragment: local functions that keep the queue depths admission bounds (node/intake/admission.py):
-- the set ${QUOTA_JOBS}<actor> of each actor's jobs queued and not started yet, and the hash
-- ${QUOTA_DEPTH_KEY} of their counts (field: the actor id, and '${QUOTA_ALL}' for the context).
-- Not in KEYS, as the job statistics: the scripts that queue, start or stop a job keep them,
-- whichever process runs them. A set, not a bare counter: a job counts once however often it
-- is queued or started, so a redelivery or a second start never moves a count twice.
-- The actor of a job key job:<actor>:<id> (false for any other key: counted nowhere).
local function quota_actor(job)
  return string.match(job, '^job:(%d+):%d+$') or false
end
-- how many queued jobs the actor (and the context, as '${QUOTA_ALL}') holds now
local function quota_depths(actor)
  local d = redis.call('HMGET', '${QUOTA_DEPTH_KEY}', actor, '${QUOTA_ALL}')
  return tonumber(d[1]) or 0, tonumber(d[2]) or 0
end
-- job was queued: counted for its actor and the context (once)
local function quota_queued(job)
  local actor = quota_actor(job)
  if actor and redis.call('SADD', '${QUOTA_JOBS}' .. actor, job) == 1 then
    redis.call('HINCRBY', '${QUOTA_DEPTH_KEY}', actor, 1)
    redis.call('HINCRBY', '${QUOTA_DEPTH_KEY}', '${QUOTA_ALL}', 1)
  end
end
-- job left its queue (started, or stopped while queued): no longer counted
local function quota_left(job)
  local actor = quota_actor(job)
  if actor and redis.call('SREM', '${QUOTA_JOBS}' .. actor, job) == 1 then
    redis.call('HINCRBY', '${QUOTA_DEPTH_KEY}', actor, -1)
    redis.call('HINCRBY', '${QUOTA_DEPTH_KEY}', '${QUOTA_ALL}', -1)
  end
end
