-- A slot's non-blocking, reliable pop over several lists.
-- KEYS: inflight, then the lists in consume order
-- ARGV: none
-- Returns the entry moved or, if every list is empty, the in-flight list's length (an integer:
-- what a blocking pop that follows compares with its own, node/worker/loop.py).
-- Atomic effect: the oldest entry of the first non-empty list moves onto the in-flight list,
-- so a crash never loses it (one LMPOP over all the lists, then the push: a script is atomic).
local args = {#KEYS - 1, unpack(KEYS, 2)}
args[#args + 1] = 'RIGHT'
local got = redis.call('LMPOP', unpack(args))
if not got then return redis.call('LLEN', KEYS[1]) end
redis.call('LPUSH', KEYS[1], got[2][1])
return got[2][1]
