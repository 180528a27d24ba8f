-- Materialise a batch of job messages.
-- KEYS: [1] the in-flight list, then the type queues whose depth to report
-- ARGV: [1] the batch as JSON: [{key, seen, nonce ("" if none), event ('submitted': origin
--       and destination this node, else 'received'; the job statistics' count), jobs: [{key,
--       queue ("" = none), fields: [k, v, ...]}]}], [2] now (s), [3] the replay window (s),
--       [4] '1': count the job statistics (returned: stats_collected), [5] the most jobs one
--       actor may hold queued in the context, [6] the most the context may (0: no bound)
-- Returns: {codes, depth, owners, counted}: a code per message (0 materialised, 1 replay of the
-- key, 2 replay of the nonce, 3 a job key held by another message, 4 past its actor's queue
-- bound, 5 past the context's), the deepest reported queue afterwards, per message "<job key>
-- <its holder>" (code 3) or "<depth> <bound>" (4, 5) or "", and what was counted (ARGV[4]).
-- Atomic effect: per message, the replay check and, unless refused, its job hashes, their
-- queue entries (a job queued for the first time stamped stats_queued_ms in its own write),
-- the message's status 'acknowledged', its replay markers (with the window as
-- TTL) and its in-flight ack. A job hash that exists is written only by the message it names
-- as message_key: a message naming another message's job (a replayed or reused job id) is
-- refused whole, nothing of it written. A replay of an earlier message of the same batch is
-- refused as such. Each queued job is counted for its actor and the context (quota_depth), and
-- a message whose queued jobs would take either past its bound is refused whole: the check
-- and the count are one step, so concurrent batches never overshoot a bound.
-- include: stats_jobs
-- include: quota_depth
-- (j.fresh: no key of that name yet, so the job is queued for the first time)
local function taken(m)
  for _, j in ipairs(m.jobs) do
    local kind = redis.call('TYPE', j.key).ok
    j.fresh = kind == 'none'
    if kind ~= 'none' then
      local holder = kind == 'hash' and redis.call('HGET', j.key, 'message_key') or false
      if holder ~= m.key then return j.key .. ' ' .. (holder or ('a ' .. kind)) end
    end
  end
  return ''
end
-- One EXISTS of both replay markers and every job key the message names: none is there (the
-- common case: a new message naming new jobs), so no TYPE per job. A message of many jobs
-- takes the checks one by one (unpack spreads a bounded number of values).
local function all_new(m)
  if #m.jobs > 64 then return false end
  local names = {m.seen, m.nonce ~= '' and m.nonce or m.seen}
  for _, j in ipairs(m.jobs) do names[#names + 1] = j.key end
  if redis.call('EXISTS', unpack(names)) > 0 then return false end
  for _, j in ipairs(m.jobs) do j.fresh = true end
  return true
end
local batch = cjson.decode(ARGV[1])
if ARGV[4] == '1' then stats_collected = {} end
local out, owners = {}, {}
local depth_of = {}  -- a queue's length as the last LPUSH on it said: no LLEN of it after
local actor_bound, context_bound = tonumber(ARGV[5]) or 0, tonumber(ARGV[6]) or 0
-- 4 or 5 and "<depth> <bound>" if queuing m's jobs would take its actor or the context past
-- its bound; 0 and '' else
local function over_bound(m)
  local n = 0
  for _, j in ipairs(m.jobs) do
    if j.queue ~= '' then n = n + 1 end
  end
  local actor = n > 0 and quota_actor(m.jobs[1].key)
  if not actor then return 0, '' end
  local mine, all = quota_depths(actor)
  if actor_bound > 0 and mine + n > actor_bound then return 4, mine .. ' ' .. actor_bound end
  if context_bound > 0 and all + n > context_bound then return 5, all .. ' ' .. context_bound end
  return 0, ''
end
for i, m in ipairs(batch) do
  local code, owner = 0, ''
  if all_new(m) then
    code = 0
  elseif redis.call('EXISTS', m.seen, m.nonce ~= '' and m.nonce or m.seen) == 0 then
    owner = taken(m)
    if owner ~= '' then code = 3 end
  elseif redis.call('EXISTS', m.seen) == 1 then
    code = 1
  else
    code = 2
  end
  if code == 0 then code, owner = over_bound(m) end
  if code == 0 then
    for _, j in ipairs(m.jobs) do
      if j.fresh then  -- stamped in the same write (a held job keeps its first stamp)
        local f = {unpack(j.fields)}
        f[#f + 1], f[#f + 2] = 'stats_queued_ms', stats_ms()
        redis.call('HSET', j.key, unpack(f))
        stats_count_queued(j.key, m.event, j.fields)
      else
        redis.call('HSET', j.key, unpack(j.fields))
        stats_queued(j.key, m.event, j.fields)
      end
      if j.queue ~= '' then
        depth_of[j.queue] = redis.call('LPUSH', j.queue, j.key)
        quota_queued(j.key)
      end
    end
    redis.call('HSET', m.key, 'status', 'acknowledged', 'updated_at', ARGV[2])
    redis.call('SET', m.seen, '1', 'EX', ARGV[3])
    if m.nonce ~= '' then redis.call('SET', m.nonce, m.key, 'EX', ARGV[3]) end
    redis.call('LREM', KEYS[1], 1, m.key)
  end
  out[i] = code
  owners[i] = owner
end
local depth = 0
for i = 2, #KEYS do
  depth = math.max(depth, depth_of[KEYS[i]] or redis.call('LLEN', KEYS[i]))
end
return {out, depth, owners, stats_collected or {}}
