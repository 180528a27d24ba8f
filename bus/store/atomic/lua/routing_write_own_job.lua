-- Write one job hash of a message, outside a materialised batch (the origin's copies).
-- KEYS: [1] the job hash
-- ARGV: [1] the message key, [2] '1': the node counts the job statistics (returned, not
--       written: stats_collected), then the job's fields and values (naming it as message_key)
-- Returns: {1, counted} if written (what was counted if ARGV[2] asks, [field, increment, ...];
-- else empty), {0, {}} if the key holds another message's job or another type.
-- Atomic effect: write_own_job's (routing_write_own_job_fn).
-- include: routing_write_own_job_fn
if ARGV[2] == '1' then stats_collected = {} end
if not write_own_job(KEYS[1], ARGV[1], {unpack(ARGV, 3)}) then return {0, {}} end
return {1, stats_collected or {}}
