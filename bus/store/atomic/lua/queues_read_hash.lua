-- Read one hash an entry names.
-- KEYS: [1] the key
-- ARGV: none
-- Returns: read_hash(KEYS[1]): its fields and values, {} if absent, else its type's name.
-- Atomic effect: none (a read that never fails on a key of the wrong type).
-- include: queues_hash_reader
return read_hash(KEYS[1])
