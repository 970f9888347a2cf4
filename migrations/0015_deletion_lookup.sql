-- A message logged after the deletion that names it (a producer's spool delivered late) must still
-- be shredded: each batch of messages looks for deletions naming them in its thread and the chat
-- it is a topic of. A partial index keeps that to the few deletion events, whatever the log's size.
-- depends: 0014_pair_cache

CREATE INDEX events_deletions ON events (thread_id) WHERE type = 'message_deleted';
