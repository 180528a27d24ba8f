-- Route a batch of checked messages leaving msg_out (the supervisor's route_many).
-- KEYS: [1] msg_in, [2] the in-flight list, [3] the deadlines sorted set
-- ARGV: [1] the batch as JSON: [{key, to_msg_in ('1': this node is its destination), copies:
--         [{key, fields: [k, v, ...]}], deadlines: ZADD's [score, member, ...] of its ack and
--         result deadlines (routing.deadline_members), or []}],
--       [2] '1': the node counts the job statistics (returned, not written: stats_collected)
-- Returns: what was counted if ARGV[2] asks ([field, increment, ...]; else empty).
-- Atomic effect: per message, queued on msg_in, or its origin copies written under
-- write_own_job's rule (routing_write_own_job_fn) and its ack and result deadlines armed;
-- then its in-flight ack. All of it or none: a message is never acked without what routing
-- it wrote. The deadlines are armed in one ZADD and the in-flight list is trimmed once for the
-- batch (inflight_ack).
-- include: routing_write_own_job_fn
-- include: inflight_ack
-- include: chunked
if ARGV[2] == '1' then stats_collected = {} end
local batch = cjson.decode(ARGV[1])
-- one EXISTS of every copy's key: none there (the common case), no TYPE per copy
local copies = {}
for _, m in ipairs(batch) do
  for _, c in ipairs(m.copies) do copies[#copies + 1] = c.key end
end
local new = not exists_any(copies, 1)
local acked, written, deadlines = {}, {}, {}
for _, m in ipairs(batch) do
  if m.to_msg_in == '1' then
    redis.call('LPUSH', KEYS[1], m.key)
  else
    for _, c in ipairs(m.copies) do
      -- a key an earlier message of this batch wrote is checked as any existing one
      write_own_job(c.key, m.key, c.fields, new and not written[c.key])
      written[c.key] = true
    end
    for _, v in ipairs(m.deadlines) do deadlines[#deadlines + 1] = v end
  end
  acked[#acked + 1] = m.key
end
-- the batch's deadlines in one ZADD (a member named twice keeps its last score, as one ZADD
-- per message would leave it)
call_chunked('ZADD', KEYS[3], deadlines)
inflight_ack(KEYS[2], acked)
return stats_collected or {}
