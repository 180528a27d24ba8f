-- Recover what a previous run left in flight.
-- KEYS: [1] in-flight list, [2] source list, [3] redeliveries hash, [4] dlq list,
--       [5] dlq events list (the dlq watcher's copy of each dead letter)
-- ARGV: [1] the most deliveries an entry may have, [2] now (s), [3] the source's name
-- Returns: how many entries went back to the source.
-- Atomic effect: every in-flight entry moves back to the consuming (right) end of the source
-- and its delivery count grows by one; an entry past ARGV[1] deliveries leaves the source
-- again and becomes a dead letter (reason too_many_deliveries, its count dropped). The
-- redeliveries hash expires a day after the last recovery.
local moved = 0
while true do
  local item = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
  if not item then break end
  local n = redis.call('HINCRBY', KEYS[3], item, 1)
  if n > tonumber(ARGV[1]) then
    redis.call('LREM', KEYS[2], -1, item)
    redis.call('HDEL', KEYS[3], item)
    local entry = cjson.encode({key = item, reason = 'too_many_deliveries',
      detail = 'delivered ' .. n .. ' times without being processed', at = tonumber(ARGV[2]),
      queue = ARGV[3], count = n})
    redis.call('LPUSH', KEYS[4], entry)
    redis.call('LPUSH', KEYS[5], entry)
  else
    moved = moved + 1
  end
end
redis.call('EXPIRE', KEYS[3], 86400)
return moved
