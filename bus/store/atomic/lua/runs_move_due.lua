-- Queue every delayed retry that is due.
-- KEYS: delayed dlq dlq_events (the dlq watcher's copy of each dead letter)
-- ARGV: now_ms now_s
-- Returns the score (ms) of the next entry still delayed, or -1 if none.
-- Atomic effect: each member '<queue>|<job key>' scored <= now_ms leaves the zset and its job
-- key is pushed on its queue; a member of another shape, or naming a key that holds no list,
-- goes to the dlq instead (its bytes escaped, so the entry is JSON text) rather than failing
-- the whole move.
-- include: chunked
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
call_chunked('ZREM', KEYS[1], due)  -- one ZREM for what is due, not one per member
for _, member in ipairs(due) do
  local sep = string.find(member, '|', 1, true)
  local pushed = sep and redis.pcall('LPUSH', string.sub(member, 1, sep - 1),
                                     string.sub(member, sep + 1))
  if (not pushed) or (type(pushed) == 'table' and pushed.err) then
    local shown = string.gsub(string.sub(member, 1, 1000), '[^\32-\126]', function(c)
      return string.format('\\x%02x', string.byte(c)) end)
    local entry = cjson.encode({key = shown, reason = 'malformed_entry',
      detail = 'a delayed retry must be <queue>|<job key> naming a list', at = tonumber(ARGV[2]),
      queue = ''})
    redis.call('LPUSH', KEYS[2], entry)
    redis.call('LPUSH', KEYS[3], entry)
  end
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #nxt == 0 then return -1 end
return tonumber(nxt[2])
