-- Fragment: the replay markers, data model v3: the hash ${REPLAY_KEY} whose fields (keys.seen:
-- seen:<message key>, keys.nonce: nonce:<caller_id>:<nonce>) expire one by one (Valkey 9
-- HSETEX), each after the replay window. A batch reads all its markers in one HMGET and sets
-- them in one HSETEX.
-- replay_found(fields): the set (a table field -> true) of those of fields that are marked
local function replay_found(fields)
  local out = {}
  for i = 1, #fields, 500 do
    local last = math.min(i + 499, #fields)
    local got = redis.call('HMGET', '${REPLAY_KEY}', unpack(fields, i, last))
    for k = i, last do
      if got[k - i + 1] then out[fields[k]] = true end
    end
  end
  return out
end
-- replay_mark(flat, window_s): set the markers of flat ({field, value, ...}) for window_s seconds
local function replay_mark(flat, window_s)
  for i = 1, #flat, 1000 do
    local last = math.min(i + 999, #flat)
    redis.call('HSETEX', '${REPLAY_KEY}', 'EX', window_s, 'FIELDS', (last - i + 1) / 2,
               unpack(flat, i, last))
  end
end
-- replay_note(flat, marked, seen, nonce, key): an accepted message's markers, added to flat
-- (for replay_mark) and to marked (what the batch's later messages find marked already)
local function replay_note(flat, marked, seen, nonce, key)
  marked[seen] = true
  flat[#flat + 1], flat[#flat + 2] = seen, '1'
  if nonce ~= '' then
    marked[nonce] = true
    flat[#flat + 1], flat[#flat + 2] = nonce, key
  end
end
