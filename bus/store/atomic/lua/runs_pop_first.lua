-- A slot's non-blocking, reliable pop over several lists.
-- KEYS: inflight, then the lists in consume order
-- ARGV: none
-- Returns the entry moved, or false (nil) if every list is empty.
-- Atomic effect: the oldest entry of the first non-empty list moves onto the in-flight list,
-- so a crash never loses it.
for i = 2, #KEYS do
  local v = redis.call('LMOVE', KEYS[i], KEYS[1], 'RIGHT', 'LEFT')
  if v then return v end
end
return false
