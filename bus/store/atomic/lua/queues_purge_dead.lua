-- Purge the dead letters of one key.
-- KEYS: [1] dlq list
-- ARGV: [1] the key whose dead letters to delete
-- Returns: how many dead letters were deleted.
-- Atomic effect: every dead letter that names ARGV[1] leaves the dlq; the others (and letters
-- that are not JSON) stay.
local n = 0
for _, raw in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  local ok, e = pcall(cjson.decode, raw)
  if ok and e.key == ARGV[1] then
    redis.call('LREM', KEYS[1], 1, raw)
    n = n + 1
  end
end
return n
