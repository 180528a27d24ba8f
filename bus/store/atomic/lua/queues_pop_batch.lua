-- Pop a batch of a reliable queue.
-- KEYS: [1] source list, [2] in-flight list
-- ARGV: [1] how many entries at most, [2] '1' to read the hash each entry names, else '0',
--       [3] (with '1') an entry a blocking pop just moved, read first (and not counted in [1])
-- Returns: {entry, ...}; with ARGV[2] == '1', {entry, read_hash(entry), entry, ...}
-- Atomic effect: up to ARGV[1] entries move from the consuming (right) end of the source to the
-- left of the in-flight list, oldest first; nothing else is written. One LMPOP and one LPUSH
-- of them all (each LPUSH argument goes to the head in turn: the same order as an LMOVE each).
-- include: queues_hash_reader
local most = tonumber(ARGV[1])
local got = most > 0 and redis.call('LMPOP', 1, KEYS[1], 'RIGHT', 'COUNT', most)
local entries = got and got[2] or {}
if got then redis.call('LPUSH', KEYS[2], unpack(entries)) end
if ARGV[2] ~= '1' then return entries end
if ARGV[3] then table.insert(entries, 1, ARGV[3]) end
local out = {}
for _, v in ipairs(entries) do
  out[#out + 1] = v
  out[#out + 1] = read_hash(v)
end
return out
