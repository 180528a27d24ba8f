-- The started jobs whose lease lapsed, for the reaper (node/runners/external.py), and how long
-- until the next lease lapses.
-- KEYS: running
-- ARGV: most (how many lapsed jobs to return at once)
-- Returns {wait_ms, job...}: the jobs whose score (their lease's expiry, ms) is not ahead of
-- Valkey's clock, oldest first, and the time until the earliest lease still live lapses (-1:
-- none).
-- Atomic effect: none (reads only; the reaper ends each job alone: runs_reap).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {-1}
for _, job in ipairs(redis.call('ZRANGE', KEYS[1], '-inf', now_ms, 'BYSCORE', 'LIMIT', 0,
                                tonumber(ARGV[1]))) do
  out[#out + 1] = job
end
local next_due = redis.call('ZRANGE', KEYS[1], '(' .. now_ms, '+inf', 'BYSCORE', 'LIMIT', 0, 1,
                            'WITHSCORES')
if #next_due > 0 then out[1] = math.max(1, tonumber(next_due[2]) - now_ms) end
return out
