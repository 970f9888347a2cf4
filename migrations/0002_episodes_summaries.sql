-- Episodes, messages and summaries (projections of the event log, per generation), caches for
-- embeddings and LLM outputs, and the command acknowledgements.
-- depends: 0001_event_log

ALTER TABLE threads
    ADD COLUMN generation       integer NOT NULL DEFAULT 1,
    ADD COLUMN memory_on        boolean NOT NULL DEFAULT true,
    ADD COLUMN config           jsonb   NOT NULL DEFAULT '{}',
    ADD COLUMN segmenter_state  jsonb,
    ADD COLUMN current_episode  jsonb,
    ADD COLUMN episode_count    integer NOT NULL DEFAULT 0,
    ADD COLUMN message_count    integer NOT NULL DEFAULT 0;

CREATE TABLE episodes (
    episode_id    text        NOT NULL,
    generation    integer     NOT NULL,
    thread_id     text        NOT NULL,
    ordinal       integer     NOT NULL,
    start_seq     integer     NOT NULL,
    end_seq       integer,
    status        text        NOT NULL DEFAULT 'open',   -- open | closed
    opened_by     text        NOT NULL,                   -- first | gap | marker | shift | command | length
    closed_by     text,
    started_at    timestamptz NOT NULL,
    ended_at      timestamptz,
    topic_label   text,
    PRIMARY KEY (episode_id, generation)
);
CREATE INDEX episodes_thread ON episodes (thread_id, generation, ordinal);

CREATE TABLE messages (
    thread_id           text        NOT NULL,
    generation          integer     NOT NULL,
    seq                 integer     NOT NULL,
    event_id            text        NOT NULL,
    stream_pos          bigint      NOT NULL,
    episode_id          text        NOT NULL,
    user_id             text        NOT NULL,
    role                text        NOT NULL,
    text                text        NOT NULL,
    platform_message_id text,
    occurred_at         timestamptz NOT NULL,
    embedding           vector,
    is_active           boolean     NOT NULL DEFAULT true,
    PRIMARY KEY (thread_id, generation, seq)
);
CREATE INDEX messages_episode ON messages (episode_id, generation, seq);
CREATE INDEX messages_platform_id ON messages (thread_id, generation, platform_message_id);

CREATE TABLE summaries (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    summary_key    text        NOT NULL,
    generation     integer     NOT NULL,
    thread_id      text        NOT NULL,
    episode_id     text,
    kind           text        NOT NULL,   -- running | chunk | final | rollup
    level          integer     NOT NULL,
    from_seq       integer     NOT NULL,
    upto_seq       integer     NOT NULL,
    text           text        NOT NULL,
    content        jsonb       NOT NULL,
    source_ids     bigint[]    NOT NULL DEFAULT '{}',
    model          text        NOT NULL,
    prompt_version text        NOT NULL,
    is_active      boolean     NOT NULL DEFAULT true,
    archived_at    timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (generation, summary_key)
);
CREATE INDEX summaries_thread ON summaries (thread_id, generation, level, is_active);
CREATE INDEX summaries_episode ON summaries (episode_id, generation, kind);

CREATE TABLE commands_applied (
    event_id    text        NOT NULL,
    generation  integer     NOT NULL,
    thread_id   text        NOT NULL,
    command     text        NOT NULL,
    status      text        NOT NULL,   -- applied | rejected
    detail      text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, generation)
);

CREATE TABLE embedding_cache (
    model      text        NOT NULL,
    text_hash  bytea       NOT NULL,
    vector     vector      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model, text_hash)
);

CREATE TABLE llm_cache (
    model          text        NOT NULL,
    prompt_version text        NOT NULL,
    input_hash     bytea       NOT NULL,
    output         jsonb       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model, prompt_version, input_hash)
);

-- Threads logged before these projections existed are rebuilt from the log by the doorbell.
UPDATE threads SET cursor_pos = 0, applied_events = 0;
