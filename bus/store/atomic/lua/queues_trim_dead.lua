-- Drop archived dead letters from the old end of the dlq.
-- KEYS: [1] dlq list
-- ARGV: the entries archived, oldest first (as read from the dlq's tail)
-- Returns: how many entries left the dlq.
-- Atomic effect: while the dlq's oldest entry is the next of ARGV, it is removed; the first
-- mismatch (an entry retried or purged since it was read) stops, so nothing is dropped that
-- was not archived.
local n = 0
for _, entry in ipairs(ARGV) do
  if redis.call('LINDEX', KEYS[1], -1) ~= entry then break end
  redis.call('RPOP', KEYS[1])
  n = n + 1
end
return n
