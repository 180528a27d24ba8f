-- Re-drive a dead letter.
-- KEYS: [1] dlq list, [2] redeliveries hash
-- ARGV: [1] the key whose dead letters to re-drive
-- Returns: how many dead letters of the key were re-driven (0: none, or none names a queue).
-- Atomic effect: each dead letter of ARGV[1] that names the queue it was refused on leaves the
-- dlq, the key's delivery count is dropped, and the key is queued once on the queue of the
-- first such letter. Letters that are not JSON are left alone.
local n = 0
for _, raw in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  local ok, e = pcall(cjson.decode, raw)
  if ok and e.key == ARGV[1] and e.queue and e.queue ~= '' then
    redis.call('LREM', KEYS[1], 1, raw)
    redis.call('HDEL', KEYS[2], e.key)
    if n == 0 then redis.call('LPUSH', e.queue, e.key) end
    n = n + 1
  end
end
return n
