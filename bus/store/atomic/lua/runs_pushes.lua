-- Fragment: the list pushes that answer an attempt (a client's reply, a flow's event, a result
-- message's key on msg_out): local function answers_push(list, value, ttl) pushes value on list
-- (then EXPIRE ttl, if given: false for none). While answers_batch is a table (a batch's ends:
-- runs.ends_then_source; a batch of results at the origin: routing_accept_results), the pushes
-- are collected and answers_flush makes them per list: one LPUSH of all a list's values (in the
-- order one push each would leave them) and one EXPIRE.
-- answers_first(list, value, ttl) is a push whose failure is the caller's check of the list's
-- type (a pcall: false, nothing written, if the list holds another type): made at once, so the
-- list exists from then on; while batching, the list's later pushes are collected behind it
-- and its EXPIRE waits for the flush.
-- include: chunked
-- include: batch_entry
local answers_batch = false
local function answers_new()
  return {values = {}}
end
local function answers_push(list, value, ttl)
  if not answers_batch then
    redis.call('LPUSH', list, value)
    if ttl then redis.call('EXPIRE', list, ttl) end
    return
  end
  local b = batch_entry(answers_batch, list, answers_new)
  b.values[#b.values + 1] = value
  b.ttl = ttl or b.ttl
end
local function answers_first(list, value, ttl)
  local pushed = redis.pcall('LPUSH', list, value)
  if type(pushed) == 'table' and pushed['err'] then return false end
  if not answers_batch then
    if ttl then redis.call('EXPIRE', list, ttl) end
  else
    local b = batch_entry(answers_batch, list, answers_new)
    b.ttl = ttl or b.ttl
  end
  return true
end
local function answers_flush()
  local batch = answers_batch
  answers_batch = false
  if not batch then return end
  for _, list in ipairs(batch) do
    local b = batch[list]
    call_chunked('LPUSH', list, b.values)
    if b.ttl then redis.call('EXPIRE', list, b.ttl) end
  end
end
