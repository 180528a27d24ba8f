-- Pop a batch of a reliable queue.
-- KEYS: [1] source list, [2] in-flight list
-- ARGV: [1] how many entries at most, [2] '1' to read the hash each entry names, else '0'
-- Returns: {entry, ...}; with ARGV[2] == '1', {entry, read_hash(entry), entry, ...}
-- Atomic effect: up to ARGV[1] entries move from the consuming (right) end of the source to the
-- left of the in-flight list, oldest first; nothing else is written.
-- include: queues_hash_reader
local out = {}
for i = 1, tonumber(ARGV[1]) do
  local v = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
  if not v then break end
  out[#out + 1] = v
  if ARGV[2] == '1' then out[#out + 1] = read_hash(v) end
end
return out
