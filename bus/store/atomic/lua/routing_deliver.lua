-- Deliver the messages of one frame that arrived over a link.
-- KEYS: [1] msg_in, [2..] the message hashes
-- ARGV: per message, in KEYS order: the number n of its hash's items (fields and values), then
--       those n items
-- Returns: per message, 1 if it was stored, 0 if it was already here (or had no field: an
-- empty hash is no message, and nothing can store one).
-- Atomic effect: each new message is stored, and the new ones' keys are queued on msg_in in
-- their order (one LPUSH); a redelivered one (its key exists, also by an earlier copy in this
-- frame) changes nothing, so it is acknowledged again but stored and queued once; one EXISTS
-- of every key finds that none is there in the common case. One script for the frame: every
-- message it found was written before anything it writes, so one WAITAOF after it covers the
-- frame whenever it stored one (bus/store/durable.py).
-- include: chunked
-- one EXISTS of every message key: none there (the common case: a first delivery), no EXISTS
-- per message; a copy of a message stored earlier in this frame is found in stored
local any = exists_any(KEYS, 2)
local out, new, stored = {}, {}, {}
local a = 1
for i = 2, #KEYS do
  local n = tonumber(ARGV[a])
  -- no command here may fail: a failure half-way would leave stored messages unqueued
  if n == 0 or stored[KEYS[i]] or (any and redis.call('EXISTS', KEYS[i]) == 1) then
    out[i - 1] = 0
  else
    redis.call('HSET', KEYS[i], unpack(ARGV, a + 1, a + n))
    stored[KEYS[i]] = true
    new[#new + 1] = KEYS[i]
    out[i - 1] = 1
  end
  a = a + 1 + n
end
call_chunked('LPUSH', KEYS[1], new)
return out
