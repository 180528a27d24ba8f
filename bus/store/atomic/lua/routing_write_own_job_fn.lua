-- Fragment (included, never run alone): write_own_job(job, message_key, fields, new).
-- One job hash of a message, outside a materialised batch (the origin's copies). Arguments:
-- the job hash, the message key, the job's fields and values [k, v, ...] (naming it as
-- message_key), and new: true when the caller knows no key of that name exists (no TYPE). Returns true if written, false if the key holds another message's job or
-- another type (left as it is: the rule of queues_materialise). A job queued for the first
-- time is stamped stats_queued_ms in the write that creates it, and counted.
-- include: stats_jobs
local function write_own_job(job, message_key, fields, new)
  local kind = new and 'none' or redis.call('TYPE', job).ok
  if kind ~= 'none' and (kind ~= 'hash' or redis.call('HGET', job, 'message_key') ~= message_key)
  then return false end
  if kind == 'none' then
    local f = {unpack(fields)}
    f[#f + 1], f[#f + 2] = 'stats_queued_ms', stats_ms()
    redis.call('HSET', job, unpack(f))
    stats_count_queued(job, 'submitted', fields)
  else
    redis.call('HSET', job, unpack(fields))
    stats_queued(job, 'submitted', fields)
  end
  return true
end
