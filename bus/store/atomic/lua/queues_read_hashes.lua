-- Read several hashes in one round trip.
-- KEYS: the keys
-- ARGV: none
-- Returns: one read_hash reply per key, in order.
-- Atomic effect: none (one key of the wrong type costs the others nothing).
-- include: queues_hash_reader
local out = {}
for i, k in ipairs(KEYS) do out[i] = read_hash(k) end
return out
