-- Start the entry a blocking pop just moved onto a slot's in-flight list: pipelined behind that
-- BLMOVE on the same connection, it runs as soon as the pop returns (no round trip of its own).
-- KEYS: inflight running
-- ARGV: held (the in-flight list's length before the pop) token_base ttl_ms now runner_id
--       [script_type: its breaker is consulted] [counted: '1', the caller counts the
--       start in its own sums (runs_begin)]
-- Returns {} if the pop moved nothing (the list holds no more than ``held``: it timed out), else
-- {entry, start} with start as runs_start returns it for that entry (a reason token, {} for a
-- final job, 'breaker_open:<ms>', or the job's fields after the start), its token
-- '<token_base>:<entry>'.
-- Atomic effect: as runs_start on the in-flight list's head, when the list grew; an entry not
-- started stays in flight for the caller to refuse, drop or give back, as after runs_start.
-- include: runs_start_one
-- one read: the head, and whether the list holds more than it held (LRANGE: what the runner
-- user may read a list with; held is 0 but for a stale entry, so this reads one or two)
local held = tonumber(ARGV[1])
local head = redis.call('LRANGE', KEYS[1], 0, held)
if #head <= held then return {} end
local job = head[1]
local token = ARGV[2] .. ':' .. job
return {job, start_one(job, KEYS[2], token, ARGV[3], ARGV[4], ARGV[5], ARGV[6] or '',
                       ARGV[7] == '1')}
