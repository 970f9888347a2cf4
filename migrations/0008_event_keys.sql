-- Crypto-shredding (adapters/keys_pg.py): the content of every logged event is sealed with a
-- data key of its (user, thread); the keys are kept here wrapped by the key-encryption key
-- (KEK). Erasure sets `wrapped` to NULL: the events stay in the append-only log, their content
-- unreadable for good. A later message of the same user gets a fresh key.
-- depends: 0007_message_dates

CREATE TABLE event_keys (
    key_id       text        PRIMARY KEY,   -- random; the associated data of the wrapping
    user_id      text        NOT NULL,
    thread_id    text        NOT NULL,
    wrapped      bytea,                     -- NULL once destroyed
    created_at   timestamptz NOT NULL DEFAULT now(),
    destroyed_at timestamptz
);
CREATE UNIQUE INDEX event_keys_live ON event_keys (user_id, thread_id) WHERE wrapped IS NOT NULL;
CREATE INDEX event_keys_thread ON event_keys (thread_id);

-- Which KEK wrapped the keys: a process started with another KEK refuses to run rather than
-- seal with keys nobody else can open.
CREATE TABLE kek_check (
    id          integer PRIMARY KEY CHECK (id = 1),
    fingerprint bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Erasures done, with what each removed (counts per store; no content).
CREATE TABLE erasures (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope        text        NOT NULL,   -- user | thread
    subject      text        NOT NULL,   -- the user or thread id
    requested_by text        NOT NULL,   -- cli | api | command:<event_id> | retention
    removed      jsonb       NOT NULL DEFAULT '{}',
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);

-- An LLM output is derived from a thread's content: erasing the thread's content removes it.
ALTER TABLE llm_cache ADD COLUMN thread_id text;
CREATE INDEX llm_cache_thread ON llm_cache (thread_id) WHERE thread_id IS NOT NULL;

-- The attachment reference as sent (url, name, caption), copied when the message is projected:
-- the attachments worker and search read it here, not from the sealed log. NULL for rows
-- projected before this migration, which read it from their (clear) event.
ALTER TABLE attachments ADD COLUMN ref jsonb;
