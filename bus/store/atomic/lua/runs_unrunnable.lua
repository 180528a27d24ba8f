-- Fragment: local function unrunnable(v), for the scripts that start a job.
-- Why the queue entry v names nothing a runner can start (a reason token: 'missing_hash',
-- 'wrong_type', 'malformed_job'), or false and the job's fields (a table, read once: the
-- script starts the job from it and returns it); a final job's entry is a harmless duplicate
-- (false too: the caller sees its status). Reads only, so that a script checks it before any
-- write and one hostile entry never aborts a script half-way: the read is a pcall, whose error
-- says that the key holds another type (no TYPE before it; an absent key reads as no fields).
local function unrunnable(v)
  local flat, f = redis.pcall('HGETALL', v), {}
  if flat['err'] then return 'wrong_type' end
  if #flat == 0 then return 'missing_hash' end
  if string.find(v, '[\128-\255]') then return 'malformed_job' end
  for i = 1, #flat, 2 do f[flat[i]] = flat[i + 1] end
  local st = f['status']
  if not st then return 'malformed_job' end
  if st == 'finished' or st == 'error' then return false, f end
  local n = f['attempt']
  if n and not string.match(n, '^%d%d?%d?%d?%d?%d?%d?%d?%d?$') then return 'malformed_job' end
  return false, f
end
