-- Materialise a batch of job messages.
-- KEYS: [1] the in-flight list, then the type queues whose depth to report
-- ARGV: [1] the batch as JSON: [{key, seen, nonce ("" if none): its replay markers (fields of
--       the replay hash), event ('submitted': origin and destination this node, else
--       'received'; the job statistics' count), jobs: [{key, queue ("" = none), fields: [k, v,
--       ...]}]}], [2] now (s), [3] the replay window (s), [4] '1': count the job statistics
--       (returned: stats_collected), [5] the most jobs one actor may hold queued in the
--       context, [6] the most the context may (0: no bound), [7] its fair share: the most jobs
--       one actor may hold in the context's queues, the rest wait (quota_push; 0: no bound)
-- Returns: {codes, depth, owners, counted}: a code per message (0 materialised, 1 replay of the
-- key, 2 replay of the nonce, 3 a job key held by another message, 4 past its actor's queue
-- bound, 5 past the context's), the deepest reported queue afterwards, per message "<job key>
-- <its holder>" (code 3) or "<depth> <bound>" (4, 5) or "", and what was counted (ARGV[4]).
-- Atomic effect: per message, the replay check and, unless refused, its job hashes, their
-- queue entries (a job queued for the first time stamped stats_queued_ms in its own write),
-- the message's status 'acknowledged', its replay markers (with the window as TTL) and its
-- in-flight ack. A job hash that exists is written only by the message it names as
-- message_key: a message naming another message's job (a replayed or reused job id) is
-- refused whole, nothing of it written. A replay of an earlier message of the same batch is
-- refused as such. Each queued job is counted for its actor (quota_depth), and a message whose
-- queued jobs would take its actor or the context past its bound is refused whole: the check
-- and the count are one step, so concurrent batches never overshoot a bound. A job past its
-- actor's fair share waits in its actor's list instead of its queue (quota_push), in the same
-- step: the node moves it to its queue as places free (quota_refill.lua).
-- What is the same for the whole batch is done once for it: one HMGET of every replay marker,
-- one EXISTS of every job key, one LPUSH per queue, one HINCRBY per actor, one HSETEX of the
-- markers, one trim of the in-flight list.
-- include: stats_jobs
-- include: quota_depth
-- include: replay_markers
-- include: inflight_ack
-- include: chunked
local batch = cjson.decode(ARGV[1])
if ARGV[4] == '1' then stats_collected = {} end
local actor_bound, context_bound = tonumber(ARGV[5]) or 0, tonumber(ARGV[6]) or 0
quota_batch.fair = tonumber(ARGV[7]) or 0
quota_batch.whole = context_bound > 0  -- its depth read once with every actor's (quota_all)
local names, job_keys = {}, {}
for _, m in ipairs(batch) do
  names[#names + 1] = m.seen
  if m.nonce ~= '' then names[#names + 1] = m.nonce end
  for _, j in ipairs(m.jobs) do job_keys[#job_keys + 1] = j.key end
end
local marked = replay_found(names)
-- none of the batch's job keys exists (the common case: new messages naming new jobs): then no
-- TYPE per job
local any_job = exists_any(job_keys, 1)
local written = {}  -- job key -> the message of this batch that wrote it
-- "<job key> <its holder>" for the first job of m held by another message ('' if none); sets
-- j.fresh: no key of that name yet, so the job is queued for the first time
local function taken(m)
  for _, j in ipairs(m.jobs) do
    local mine = written[j.key]
    if mine then
      j.fresh = false
      if mine ~= m.key then return j.key .. ' ' .. mine end
    elseif not any_job then
      j.fresh = true
    else
      local kind = redis.call('TYPE', j.key).ok
      j.fresh = kind == 'none'
      if kind ~= 'none' then
        local holder = kind == 'hash' and redis.call('HGET', j.key, 'message_key') or false
        if holder ~= m.key then return j.key .. ' ' .. (holder or ('a ' .. kind)) end
      end
    end
  end
  return ''
end
-- 4 or 5 and "<depth> <bound>" if queuing m's jobs would take its actor or the context past
-- its bound; 0 and '' else
local function over_bound(m)
  local n = 0
  for _, j in ipairs(m.jobs) do
    if j.queue ~= '' then n = n + 1 end
  end
  local actor = n > 0 and quota_actor(m.jobs[1].key)
  if not actor then return 0, '' end
  if actor_bound > 0 then
    local mine = quota_mine(actor)
    if mine + n > actor_bound then return 4, mine .. ' ' .. actor_bound end
  end
  if context_bound > 0 then
    local all = quota_all()
    if all + n > context_bound then return 5, all .. ' ' .. context_bound end
  end
  return 0, ''
end
local queued, queue_order = {}, {}  -- queue -> its new entries, in order
local function write_job(m, j)
  local counts = j.queue ~= '' and quota_actor(j.key)
  if j.fresh then  -- stamped (and marked counted) in the same write
    local f = {unpack(j.fields)}
    f[#f + 1], f[#f + 2] = 'stats_queued_ms', stats_ms()
    if counts then f[#f + 1], f[#f + 2] = '${QUOTA_COUNTED}', '1' end
    redis.call('HSET', j.key, unpack(f))
    stats_count_queued(j.key, m.event, j.fields)
    quota_add(j.key, counts)
  else  -- a held job keeps its first stamp, and counts once
    redis.call('HSET', j.key, unpack(j.fields))
    stats_queued(j.key, m.event, j.fields)
    quota_add(j.key, counts and redis.call('HSETNX', j.key, '${QUOTA_COUNTED}', '1') == 1)
  end
  written[j.key] = m.key
  if j.queue ~= '' and quota_push(j.queue, j.key) then
    if not queued[j.queue] then
      queued[j.queue] = {}
      queue_order[#queue_order + 1] = j.queue
    end
    local q = queued[j.queue]
    q[#q + 1] = j.key
  end
end
local out, owners, markers, acked = {}, {}, {}, {}
for i, m in ipairs(batch) do
  local code, owner = 0, ''
  if marked[m.seen] then
    code = 1
  elseif m.nonce ~= '' and marked[m.nonce] then
    code = 2
  else
    owner = taken(m)
    if owner ~= '' then code = 3 end
  end
  if code == 0 then code, owner = over_bound(m) end
  if code == 0 then
    for _, j in ipairs(m.jobs) do write_job(m, j) end
    -- a pcall: the batch's queue entries, markers and ack come after, and must not hang on a
    -- message key turned into another type under us
    redis.pcall('HSET', m.key, 'status', 'acknowledged', 'updated_at', ARGV[2])
    replay_note(markers, marked, m.seen, m.nonce, m.key)
    acked[#acked + 1] = m.key
  end
  out[i] = code
  owners[i] = owner
end
local depth_of = {}  -- a queue's length as its LPUSH said: no LLEN of it after
for _, q in ipairs(queue_order) do
  depth_of[q] = call_chunked('LPUSH', q, queued[q])
end
quota_flush()
replay_mark(markers, ARGV[3])
inflight_ack(KEYS[1], acked)
local depth = 0
for i = 2, #KEYS do
  depth = math.max(depth, depth_of[KEYS[i]] or redis.call('LLEN', KEYS[i]))
end
return {out, depth, owners, stats_collected or {}}
