-- Every vector records the model that made it (its dimension is vector_dims): reads compare a
-- query only with vectors of the query's model, so two models never mix in one search. Rows
-- written before this migration have NULL: the model configured when they were written.
-- `embedding_state` is the embedder in use once `chatmem reembed` has switched models (no row:
-- the configured one); `paused` holds live projection while a re-embedding builds.
-- depends: 0008_event_keys

ALTER TABLE messages ADD COLUMN embed_model text;
ALTER TABLE summaries ADD COLUMN embed_model text;
ALTER TABLE artifact_text ADD COLUMN embed_model text;
-- A re-embedding stages the new vector of each artifact text here, then swaps it in at the switch.
ALTER TABLE artifact_text ADD COLUMN embedding_next vector;
ALTER TABLE artifact_text ADD COLUMN embed_model_next text;

CREATE TABLE embedding_state (
    id          integer PRIMARY KEY CHECK (id = 1),
    provider    text        NOT NULL,
    model       text        NOT NULL,
    dim         integer     NOT NULL,
    paused      boolean     NOT NULL DEFAULT false,
    building    text,                     -- the model a running re-embedding builds
    switched_at timestamptz
);
