-- A large scope's text matches are found by testing each of its messages' text vectors against
-- the query. From the table that read whole rows, nine in ten of whose bytes are the embedding:
-- at 50,000 messages in scope, 12,800 pages (43 ms cached, 120 ms from disk). This index holds
-- what the test and the text ranking read, so the same scope reads about 1,300 pages of it,
-- without the table (docs/benchmarks.md). A btree entry must fit a third of a page (2,704
-- bytes), so a long message's vector stays out (`adapters/recall_pg.py`, TEXT_INDEX_MAX: a
-- text form of at most 1,100 bytes keeps the stored vector under 2,200); the second index
-- finds those few within a scope.
-- depends: 0011_vector_statistics

CREATE INDEX messages_scope_text ON messages (thread_id, generation, seq DESC) INCLUDE (occurred_at, tsv)
    WHERE octet_length(tsv::text) <= 1100;
CREATE INDEX messages_scope_long_text ON messages (thread_id, generation, seq DESC)
    WHERE octet_length(tsv::text) > 1100;
-- Without statistics on the bound's expression the planner takes a third of the rows to pass it,
-- and plans a scope's matches for a third of their number.
CREATE STATISTICS messages_text_form ON (octet_length(tsv::text)) FROM messages;
ANALYZE messages;
