-- The read path: full-text vectors on everything recall searches, summary embeddings, thread
-- membership (who may read a thread) and API keys. Vector (HNSW) indexes depend on the
-- configured embedding size, so `chatmem migrate` creates them for it (adapters/migrate.py).
-- depends: 0003_facts

-- 'english' stems English and leaves other scripts as lower-cased words. The author's id is
-- part of a message's text vector, so "what did Anna say" finds Anna's turns.
ALTER TABLE messages ADD COLUMN tsv tsvector
    GENERATED ALWAYS AS (to_tsvector('english', user_id || ' ' || text)) STORED;
CREATE INDEX messages_tsv ON messages USING gin (tsv);
CREATE INDEX messages_recent ON messages (thread_id, generation, seq DESC);
CREATE INDEX messages_event ON messages (event_id);

ALTER TABLE summaries ADD COLUMN embedding vector;
ALTER TABLE summaries ADD COLUMN tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED;
CREATE INDEX summaries_tsv ON summaries USING gin (tsv);
CREATE INDEX summaries_unembedded ON summaries (thread_id) WHERE embedding IS NULL;

ALTER TABLE facts ADD COLUMN tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED;
CREATE INDEX facts_tsv ON facts USING gin (tsv);

-- Who may read a thread: everyone who wrote in it. Filled by ingest with the event log.
CREATE TABLE thread_members (
    thread_id  text        NOT NULL,
    user_id    text        NOT NULL,
    joined_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, user_id)
);
CREATE INDEX thread_members_user ON thread_members (user_id, thread_id);
INSERT INTO thread_members (thread_id, user_id)
    SELECT DISTINCT thread_id, user_id FROM events WHERE type = 'message'
    ON CONFLICT DO NOTHING;

-- API keys are stored as sha256 digests; a key reads only the users it lists ('*': all).
CREATE TABLE api_keys (
    key_hash   bytea       PRIMARY KEY,
    name       text        NOT NULL UNIQUE,
    user_ids   text[]      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
