-- Apply a result at the origin (a deadline that passed, answered locally).
-- KEYS: [1] the job copy, [2] the request message, [3] its reply list, [4] flow_events
-- ARGV: apply_result's seven values (see routing_apply_result_fn)
-- Returns: 0.
-- Atomic effect: apply_result's writes, all or none.
-- include: routing_apply_result_fn
apply_result(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV)
return 0
