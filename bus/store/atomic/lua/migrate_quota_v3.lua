-- Data model v2 -> v3: a context's queue depths, from a set of each actor's queued jobs and a
-- context-wide count to marks in the jobs' own hashes (quota_depth).
-- KEYS: [1] the queue depth hash, [2..] the v2 sets of the actors' queued jobs (quota:jobs:<actor>)
-- ARGV: the actor id of each set, in order
-- Returns: how many jobs are counted afterwards, in all.
-- Atomic effect: each member that is a job hash gets the mark ${QUOTA_COUNTED}; its actor's field
-- of the depth hash becomes the number of marked jobs (a member whose hash is gone could never
-- leave the count again: it is dropped); the sets are deleted, and v2's context-wide field
-- 'all' (v3 sums the actors' fields).
local total = 0
for i = 2, #KEYS do
  local n = 0
  for _, job in ipairs(redis.call('SMEMBERS', KEYS[i])) do
    if redis.call('TYPE', job).ok == 'hash' then
      redis.call('HSET', job, '${QUOTA_COUNTED}', '1')
      n = n + 1
    end
  end
  redis.call('HSET', KEYS[1], ARGV[i - 1], n)
  redis.call('DEL', KEYS[i])
  total = total + n
end
redis.call('HDEL', KEYS[1], 'all')
return total
