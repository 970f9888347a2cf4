-- The event log (source of truth), dead letters, per-thread cursors and the ingest watermark.

CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE events (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id       text        NOT NULL UNIQUE,
    -- Publish order: the Redis stream id packed as ms * 1e6 + sequence. A thread's events are
    -- applied in this order, whichever ingest consumer committed them first.
    stream_pos     bigint      NOT NULL,
    type           text        NOT NULL,
    schema_version integer     NOT NULL,
    thread_id      text        NOT NULL,
    user_id        text        NOT NULL,
    occurred_at    timestamptz NOT NULL,
    received_at    timestamptz NOT NULL DEFAULT now(),
    payload        jsonb       NOT NULL
);
CREATE INDEX events_thread_pos ON events (thread_id, stream_pos);
CREATE INDEX events_stream_pos ON events (stream_pos);

CREATE FUNCTION chatmem_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'chatmem: % on % refused: the table is append-only', TG_OP, TG_TABLE_NAME;
END
$$;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION chatmem_append_only();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION chatmem_append_only();

CREATE TABLE dead_letters (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source         text        NOT NULL,
    entry_id       text        NOT NULL,
    raw            bytea       NOT NULL,
    reason         text        NOT NULL,
    first_seen     timestamptz NOT NULL DEFAULT now(),
    last_seen      timestamptz NOT NULL DEFAULT now(),
    delivery_count integer     NOT NULL DEFAULT 1,
    UNIQUE (source, entry_id)
);

CREATE TABLE threads (
    thread_id      text PRIMARY KEY,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- stream_pos of the last applied event; the doorbell drains stream_pos > cursor_pos.
    cursor_pos     bigint      NOT NULL DEFAULT 0,
    applied_events bigint      NOT NULL DEFAULT 0,
    lease_owner    text,
    lease_until    timestamptz,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Every event with stream_pos below the watermark is committed: no earlier entry can still
-- arrive, so a thread may be applied up to it without skipping anything.
CREATE TABLE ingest_state (
    stream_key     text PRIMARY KEY,
    watermark      bigint      NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now()
);
