-- Fragment: inflight_ack(list, done): each entry of done (a Lua list of values) leaves the
-- in-flight list list, one occurrence each, the first from the head, as one LREM ... 1 per entry
-- would. A batch of more than two is trimmed at once: one LRANGE and one DEL (and one RPUSH of
-- what stays, in its order, when anything does: a refused entry waits for its dead letter)
-- instead of one LREM per entry. Returns how many of done were there (each removed once), and
-- the list's length after, when the trim read it (else nil: a caller that needs it asks LLEN).
-- include: chunked
local function inflight_ack(list, done)
  if #done <= 2 then
    local removed = 0
    for _, v in ipairs(done) do removed = removed + redis.call('LREM', list, 1, v) end
    return removed, nil
  end
  local left = {}
  for _, v in ipairs(done) do left[v] = (left[v] or 0) + 1 end
  local keep, removed = {}, 0
  for _, v in ipairs(redis.call('LRANGE', list, 0, -1)) do
    if (left[v] or 0) > 0 then
      left[v] = left[v] - 1
      removed = removed + 1
    else
      keep[#keep + 1] = v
    end
  end
  redis.call('DEL', list)
  call_chunked('RPUSH', list, keep)
  return removed, #keep
end
