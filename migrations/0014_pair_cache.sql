-- The segmenter's pair model answers (its logit of a topic shift for a pair of texts), cached by
-- (model, input hash) as embeddings and LLM answers are: a rebuild then decides as live processing
-- did, on another CPU or ONNX Runtime too (DESIGN.md, "Replay is deterministic"). Rows carry their
-- thread, so an erasure deletes every answer its content went into.
-- depends: 0013_episode_archived

CREATE TABLE pair_cache (
    model      text             NOT NULL,
    input_hash bytea            NOT NULL,
    thread_id  text             NOT NULL,
    logit      double precision NOT NULL,
    created_at timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (model, input_hash)
);
CREATE INDEX pair_cache_thread ON pair_cache (thread_id);
