-- Fragment: commands over a Lua list of any length. unpack puts every value it returns on
-- Lua's C stack, whose limit (8,000) a batch could pass, so a command takes at most
-- CHUNK values of the list: one command for a batch of up to CHUNK, none for an empty one.
-- call_chunked(command, key, values): redis.call(command, key, v1, v2, ...) over values, in
-- their order; returns the last call's reply (nil if none: a length after an LPUSH, say).
-- CHUNK is even: a ZADD's score and member stay in one call.
-- exists_any(names, first): whether any key of names[first..] exists (EXISTS; none after
-- the first that finds one).
local CHUNK = 1000
local function call_chunked(command, key, values)
  local reply
  for i = 1, #values, CHUNK do
    reply = redis.call(command, key, unpack(values, i, math.min(i + CHUNK - 1, #values)))
  end
  return reply
end
local function exists_any(names, first)
  for i = first, #names, CHUNK do
    if redis.call('EXISTS', unpack(names, i, math.min(i + CHUNK - 1, #names))) > 0 then
      return true
    end
  end
  return false
end
