-- Fragment (included, never run alone): read_hash(key).
-- Returns the hash ``key`` names as a flat field/value list ({} if the key is absent), or the
-- name of the type the key holds instead: a reply per entry, so that one entry naming a string
-- or a list costs no other entry of its batch (an HGETALL on it would abort the script after
-- it moved the others: it is a pcall, and only its error asks TYPE). Reads only.
local function read_hash(v)
  local h = redis.pcall('HGETALL', v)
  if h['err'] then return redis.call('TYPE', v)['ok'] end
  return h
end
