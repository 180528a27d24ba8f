-- Fragment: inflight_ack(list, done): each entry of done (a Lua list of values) leaves the
-- in-flight list list, one occurrence each. One or two: one LREM ... 1 each (the first from
-- the head). More: a pop pushed its batch on the head, so what a batch acks is most often the
-- list's oldest entries, its tail: one pop of #done from the tail (LMPOP) takes them off when
-- they are exactly done (the same entries, in any order), one command for the batch.
-- Otherwise (a refused entry waits at the tail for its dead letter, an older batch is still
-- in flight, an entry is missing) the list, what the pop took put back at its tail, is
-- trimmed at once: one LRANGE and one DEL (and one RPUSH of what stays, in its order), each
-- entry of done leaving the first occurrence from the head, as one LREM ... 1 per entry
-- would. Returns how many of done were there (each removed once), and the list's length
-- after, when the trim read it (else nil: a caller that needs it asks LLEN).
-- include: chunked
local function inflight_ack(list, done)
  if #done <= 2 then
    local removed = 0
    for _, v in ipairs(done) do removed = removed + redis.call('LREM', list, 1, v) end
    return removed, nil
  end
  local left = {}
  for _, v in ipairs(done) do left[v] = (left[v] or 0) + 1 end
  -- LMPOP, not RPOP: the same pop, and the command a runner's ACL user already has there
  local got = redis.call('LMPOP', 1, list, 'RIGHT', 'COUNT', #done)
  local tail = got and got[2] or {}
  local match = #tail == #done
  if match then
    local want = {}
    for v, n in pairs(left) do want[v] = n end
    for _, v in ipairs(tail) do
      if (want[v] or 0) == 0 then
        match = false
        break
      end
      want[v] = want[v] - 1
    end
  end
  if match then return #done, nil end
  -- the whole list, head first: what the pop left, then what it took (the tail last)
  local all = redis.call('LRANGE', list, 0, -1)
  for i = #tail, 1, -1 do all[#all + 1] = tail[i] end
  local keep, removed = {}, 0
  for _, v in ipairs(all) do
    if (left[v] or 0) > 0 then
      left[v] = left[v] - 1
      removed = removed + 1
    else
      keep[#keep + 1] = v
    end
  end
  if #all > #tail then redis.call('DEL', list) end
  call_chunked('RPUSH', list, keep)
  return removed, #keep
end
