-- Data model v2 -> v3: the runners' leases (a string lease:<job> with a TTL each) and the set
-- running, into the sorted set running scored with each lease's expiry.
-- KEYS: [1] running, [2..] v2 leases (lease:<job key>)
-- ARGV: none
-- Returns: how many started jobs have their lease in the zset from this call.
-- Atomic effect: a set running becomes the zset of the same members, each scored now (Valkey's
-- clock): a member whose lease is gone has lapsed, for the reaper to judge; then each lease
-- of a job in running, or of a job 'started' (a start cut between its two writes), scores that
-- job with now + what is left of its TTL (a lease with no TTL: now), and every lease named is
-- deleted. A running of any other type is left as it is. May run again: a lease already moved
-- is gone.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local moved = 0
if redis.call('TYPE', KEYS[1])['ok'] == 'set' then
  local members = redis.call('SMEMBERS', KEYS[1])
  redis.call('DEL', KEYS[1])
  for _, job in ipairs(members) do
    redis.call('ZADD', KEYS[1], now_ms, job)
    moved = moved + 1
  end
end
if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' and redis.call('EXISTS', KEYS[1]) == 1 then
  return moved
end
for i = 2, #KEYS do
  local job = string.sub(KEYS[i], 7)  -- after 'lease:'
  local ttl = redis.call('PTTL', KEYS[i])
  if ttl ~= -2 then
    local status = redis.pcall('HGET', job, 'status')
    local member = redis.call('ZSCORE', KEYS[1], job)
    if member or status == 'started' then
      if not member then moved = moved + 1 end
      redis.call('ZADD', KEYS[1], now_ms + math.max(ttl, 0), job)
    end
    redis.call('DEL', KEYS[i])
  end
end
return moved
