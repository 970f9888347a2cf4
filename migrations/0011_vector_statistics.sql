-- Recall keeps only vectors of the query's size (`vector_dims(embedding) = d`). The planner had
-- no statistics on that expression and took it to keep one row in 200: for a user with 20,000
-- messages it joined them to the thread list by nested loop, a million comparisons, two thirds
-- of a recall (bench soak). With these it sees that nearly every row is kept.
-- depends: 0010_edit_lookup

CREATE STATISTICS messages_embedding_dims ON (vector_dims(embedding)) FROM messages;
CREATE STATISTICS summaries_embedding_dims ON (vector_dims(embedding)) FROM summaries;
CREATE STATISTICS artifact_text_embedding_dims ON (vector_dims(embedding)) FROM artifact_text;
ANALYZE messages;
ANALYZE summaries;
ANALYZE artifact_text;
