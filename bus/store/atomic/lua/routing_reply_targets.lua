-- Read the signed reply_to of several requests at their origin, in one round trip.
-- KEYS: the request messages' keys
-- ARGV: none
-- Returns: per key, its hash's 'reply_to' field, or '' (no such field, no such key, or a key of
-- another type: a result names its request, and the accept script refuses a wrong type).
-- Atomic effect: none.
local out = {}
for i, k in ipairs(KEYS) do
  local v = redis.pcall('HGET', k, 'reply_to')  -- another type: an error, read as ''
  out[i] = type(v) == 'string' and v or ''
end
return out
