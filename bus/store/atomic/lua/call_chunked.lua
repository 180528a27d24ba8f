-- Fragment: call_chunked(command, key, values): redis.call(command, key, v1, v2, ...) over the
-- Lua list values, in its order, one call per 1000 values (one call for a batch of up to
-- 1000, none for an empty one): unpack puts every value it returns on Lua's C stack, whose
-- limit (8,000) a batch could pass. 1000 is even: a ZADD's score and member stay in one call.
-- Returns the last call's reply (nil if there was none: a length after an LPUSH, say).
local function call_chunked(command, key, values)
  local reply
  for i = 1, #values, 1000 do
    reply = redis.call(command, key, unpack(values, i, math.min(i + 999, #values)))
  end
  return reply
end
