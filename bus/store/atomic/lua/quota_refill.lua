-- Move waiting jobs into their queues, each actor up to its fair share (quota_depth: quota_push).
-- KEYS: none: the fair share's keys are the quota fragment's (${QUOTA_WAITING_KEY},
--       ${QUOTA_WAIT_PREFIX}<actor>, ${QUOTA_DEPTH_KEY}, ${QUOTA_NEXT_KEY}, ${QUOTA_WAKE_KEY})
-- ARGV: [1] the fair share (0: none, every waiting job moves), [2] the most jobs to move
-- Returns: {moved, more, bad, queues}: jobs moved; 1 if it stopped at ARGV[2] jobs with actors
-- still waiting (the wake-up is pushed again: the next call goes on from there), else 0; the
-- waiting entries that named no queue (dropped: the caller dead-letters them); the queues
-- pushed to.
-- Atomic effect: the actors of ${QUOTA_WAITING_KEY}, in id order from the one ${QUOTA_NEXT_KEY}
-- names (round robin across calls), each in turn: while it holds fewer than the fair share in
-- the queues (its count less its waiting list's length), the oldest of its waiting entries
-- moves to its queue, behind the jobs there (RPOP, LPUSH: runners pop the right end, as the
-- materialise script queues; as many as it has places in one RPOP, not one a job). An actor
-- whose list empties leaves the set. A job is in exactly one place, its queue or its list,
-- before and after: nothing lost, nothing queued twice.
-- include: quota_depth
-- include: chunked
local fair, most = tonumber(ARGV[1]) or 0, tonumber(ARGV[2]) or 1000
local actors = redis.call('SMEMBERS', '${QUOTA_WAITING_KEY}')
if #actors == 0 then return {0, 0, {}, {}} end
table.sort(actors, function(a, b) return (tonumber(a) or 0) < (tonumber(b) or 0) end)
local from = tonumber(redis.call('GET', '${QUOTA_NEXT_KEY}') or '') or 0
local start = 1
for i, a in ipairs(actors) do
  if (tonumber(a) or 0) >= from then start = i break end
end
local moved, bad, pushes, order = 0, {}, {}, {}
local function push(queue, job)
  if not pushes[queue] then
    pushes[queue] = {}
    order[#order + 1] = queue
  end
  local p = pushes[queue]
  p[#p + 1] = job
end
local more = 0
for k = 0, #actors - 1 do
  local actor = actors[(start - 1 + k) % #actors + 1]
  if moved >= most then  -- the rest next call, from this actor on
    redis.call('SET', '${QUOTA_NEXT_KEY}', actor)
    quota_wake()
    more = 1
    break
  end
  local list = '${QUOTA_WAIT_PREFIX}' .. actor
  local len = redis.call('LLEN', list)
  local room = len
  if fair > 0 then
    local held = (tonumber(redis.call('HGET', '${QUOTA_DEPTH_KEY}', actor)) or 0) - len
    room = math.min(len, fair - held)
  end
  -- the places left, in one RPOP each round (a bad entry takes no place: another round)
  while room > 0 and moved < most and len > 0 do
    local popped = redis.call('RPOP', list, math.min(room, most - moved))
    if not popped then break end
    for _, e in ipairs(popped) do
      len = len - 1
      local gap = string.find(e, ' ', 1, true)
      if gap and gap > 1 and gap < #e then
        push(string.sub(e, 1, gap - 1), string.sub(e, gap + 1))
        room, moved = room - 1, moved + 1
      else
        bad[#bad + 1] = e
      end
    end
  end
  if len <= 0 then redis.call('SREM', '${QUOTA_WAITING_KEY}', actor) end
end
if more == 0 and moved >= most and redis.call('SCARD', '${QUOTA_WAITING_KEY}') > 0 then
  quota_wake()
  more = 1
end
if more == 0 and from > 0 then redis.call('DEL', '${QUOTA_NEXT_KEY}') end
for _, q in ipairs(order) do
  call_chunked('LPUSH', q, pushes[q])
end
return {moved, more, bad, order}
