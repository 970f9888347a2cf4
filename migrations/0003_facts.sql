-- Structured facts (one active value per user, category and key; replaced values kept as
-- history) and the ledger that keeps retried fact jobs from writing twice.
-- depends: 0002_episodes_summaries

CREATE TABLE facts (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id          text        NOT NULL,
    thread_id        text        NOT NULL,
    generation       integer     NOT NULL,
    episode_id       text,
    category         text        NOT NULL CHECK (category IN ('identity', 'preference', 'constraint',
                                                              'instruction', 'decision')),
    key              text        NOT NULL,
    value            text        NOT NULL,
    text             text        NOT NULL,
    confidence       real        NOT NULL,
    importance       real        NOT NULL,
    source           text        NOT NULL,   -- extracted | remember
    source_event_ids text[]      NOT NULL,
    is_active        boolean     NOT NULL DEFAULT true,
    archived_at      timestamptz,
    archived_reason  text,                   -- replaced | forgotten | rebuilt
    archived_by      text,                   -- the event (or fact id) that archived it
    mem0_id          text,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX facts_one_active ON facts (user_id, category, key) WHERE is_active;
CREATE INDEX facts_user ON facts (user_id, is_active);
CREATE INDEX facts_thread ON facts (thread_id, generation);

CREATE TABLE fact_ledger (
    op_key     text PRIMARY KEY,            -- e.g. <episode_id>:g<generation>:facts
    result     jsonb       NOT NULL,
    done_at    timestamptz NOT NULL DEFAULT now()
);
