-- Acknowledge several entries of one in-flight list (an acks frame's outbox entries).
-- KEYS: [1] the in-flight list
-- ARGV: the entries
-- Returns: how many of them were in the list (each removed once).
-- Atomic effect: all of them leave the list together, as one MULTI of LREMs would, in one
-- command instead of one per entry; more than two in one trim of the list (inflight_ack).
-- include: inflight_ack
return (inflight_ack(KEYS[1], ARGV))
