-- One event on a script type's circuit breaker at a given time (type_breaker fragment).
-- KEYS: none (the fragment's hash)
-- ARGV: script_type event ('ok', 'fail', 'release' or 'take': a job started) now_ms job
-- Returns -1 if a 'take' may not start now, else the wait (ms) tb_wait gives after the event.
-- Atomic effect: the breaker's fields as the ending and starting scripts change them.
-- include: type_breaker
local now = tonumber(ARGV[3])
if ARGV[2] == 'take' then
  if tb_wait(ARGV[1], now) > 0 then return -1 end
  tb_started(ARGV[1], ARGV[4], now)
else
  tb_event(ARGV[1], ARGV[2], now)
end
return tb_wait(ARGV[1], now)
