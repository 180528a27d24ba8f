-- Fragment: the attempt fence, top-level code shared by every transition that ends an attempt.
-- KEYS[1] job, KEYS[2] running, KEYS[3] inflight; ARGV[1] the attempt it ends.
-- Returns 0 from the script (nothing written) unless the job is 'started' with that attempt;
-- then releases the attempt: the job taken off the running zset (its lease) and the in-flight
-- list (runs_leases, runs_inflight: a batch's ends take them off at once).
-- known: the job's fields the ending reads, read here with the fence's own (one HMGET).
-- include: runs_inflight
-- include: runs_leases
local cur = redis.call('HMGET', KEYS[1], 'status', 'attempt', 'script_type', 'breaker_probe',
                       'flow_id', 'stats_started_ms')
if cur[1] ~= 'started' or cur[2] ~= ARGV[1] then return 0 end
local known = {script_type = cur[3], breaker_probe = cur[4], flow_id = cur[5],
               stats_started_ms = cur[6]}
lease_drop(KEYS[2], KEYS[1])
inflight_leave(KEYS[3], KEYS[1])
