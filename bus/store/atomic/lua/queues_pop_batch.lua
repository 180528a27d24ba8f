-- Pop a batch of a reliable queue.
-- KEYS: [1] source list, [2] in-flight list
-- ARGV: [1] how many entries at most, [2] '1' to read the hash each entry names, else '0',
--       [3] (with '1') '1' to read first the in-flight list's head: the entry a blocking pop
--       sent just before this call on the same connection moved (the caller compares the two),
--       not counted in [1]; else '',
--       [4] a DB number, or '': the registry's version is read there, after the pops,
--       [5] (with [4]) its key
-- Returns: {entry, ...}; with ARGV[2] == '1', {entry, read_hash(entry), entry, ...} (with
-- ARGV[3] == '1' the head first, '' and {} if the in-flight list is empty); with ARGV[4], the
-- reply is {version ('0' if unset, as bus/store/records.py registry_version reads it), that list}.
-- Atomic effect: up to ARGV[1] entries move from the consuming (right) end of the source to the
-- left of the in-flight list, oldest first; nothing else is written. One LMPOP and one LPUSH
-- of them all (each LPUSH argument goes to the head in turn: the same order as an LMOVE each).
-- The version is read last, so it sees every registry write made before anything popped here
-- was pushed. SELECT in a script changes the DB of the script alone, never the caller's.
-- include: queues_hash_reader
local most = tonumber(ARGV[1])
local head = ARGV[2] == '1' and ARGV[3] == '1' and (redis.call('LINDEX', KEYS[2], 0) or '')
local got = most > 0 and redis.call('LMPOP', 1, KEYS[1], 'RIGHT', 'COUNT', most)
local entries = got and got[2] or {}
if got then redis.call('LPUSH', KEYS[2], unpack(entries)) end
local out = entries
if ARGV[2] == '1' then
  out = {}
  if head then
    out[1] = head
    out[2] = head ~= '' and read_hash(head) or {}
  end
  for _, v in ipairs(entries) do
    out[#out + 1] = v
    out[#out + 1] = read_hash(v)
  end
end
if ARGV[4] and ARGV[4] ~= '' then
  redis.call('SELECT', tonumber(ARGV[4]))
  return {redis.call('GET', ARGV[5]) or '0', out}
end
return out
