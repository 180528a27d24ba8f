-- Write one job hash of a message, outside a materialised batch (the origin's copies).
-- KEYS: [1] the job hash
-- ARGV: [1] the message key, [2] '1': the node counts the job statistics (returned, not
--       written: stats_collected), then the job's fields and values (naming it as message_key)
-- Returns: {1, counted} if written (what was counted if ARGV[2] asks, [field, increment, ...];
-- else empty), {0, {}} if the key holds another message's job or another type.
-- Atomic effect: the rule of routing_materialise: a job key held by another message (or by a
-- value that is no hash) is left as it is; else the fields are written.
-- include: stats_jobs
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'none' and (kind ~= 'hash' or redis.call('HGET', KEYS[1], 'message_key') ~= ARGV[1])
then return {0, {}} end
if ARGV[2] == '1' then stats_collected = {} end
local fields = {unpack(ARGV, 3)}
if kind == 'none' then  -- queued for the first time: stamped in the same write
  local f = {unpack(fields)}
  f[#f + 1], f[#f + 2] = 'stats_queued_ms', stats_ms()
  redis.call('HSET', KEYS[1], unpack(f))
  stats_count_queued(KEYS[1], 'submitted', fields)
else
  redis.call('HSET', KEYS[1], unpack(fields))
  stats_queued(KEYS[1], 'submitted', fields)
end
return {1, stats_collected or {}}
