-- Data model v2 -> v3: replay markers, from strings with a TTL into the replay hash.
-- KEYS: [1] the replay hash, [2..] v2 markers (seen:<message key>, nonce:<caller_id>:<nonce>)
-- ARGV: none
-- Returns: how many markers were moved.
-- Atomic effect: each marker that still exists becomes the replay hash's field of the same
-- name, with its value and what is left of its TTL (ms), and the string is deleted; a marker
-- with no TTL keeps none. A key of another type under such a name is left as it is.
local moved = 0
for i = 2, #KEYS do
  local value = redis.pcall('GET', KEYS[i])
  if type(value) == 'string' then
    local ttl = redis.call('PTTL', KEYS[i])
    if ttl > 0 then
      redis.call('HSETEX', KEYS[1], 'PX', ttl, 'FIELDS', 1, KEYS[i], value)
    else
      redis.call('HSET', KEYS[1], KEYS[i], value)
    end
    redis.call('DEL', KEYS[i])
    moved = moved + 1
  end
end
return moved
