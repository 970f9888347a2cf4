-- Attachments: the bytes are stored once per sha256 (artifacts); every message that sent them
-- holds a reference (attachments); derived text is searchable (artifact_text). All three are
-- projections of the event log: a message's attachment list is read back from its event.
-- depends: 0004_read_path

CREATE TABLE artifacts (
    sha256        text        PRIMARY KEY,
    mime_type     text        NOT NULL,
    kind          text        NOT NULL,   -- image | document
    size_bytes    bigint      NOT NULL,
    status        text        NOT NULL DEFAULT 'pending',   -- pending | processing | done | failed
    reason        text,                   -- why it failed, in words
    description   text,                   -- the short description used in surrogates
    meta          jsonb       NOT NULL DEFAULT '{}',
    attempts      integer     NOT NULL DEFAULT 0,
    claimed_until timestamptz,            -- a processing claim; a dead worker's claim expires
    created_at    timestamptz NOT NULL DEFAULT now(),
    processed_at  timestamptz
);

-- One row per attachment of a message event (position = its index in the event's list).
CREATE TABLE attachments (
    event_id   text        NOT NULL,
    position   integer     NOT NULL,
    thread_id  text        NOT NULL,
    user_id    text        NOT NULL,
    sha256     text        REFERENCES artifacts (sha256),
    status     text        NOT NULL DEFAULT 'pending',      -- pending | linked | failed
    reason     text,
    attempts   integer     NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, position)
);
CREATE INDEX attachments_sha ON attachments (sha256);
CREATE INDEX attachments_thread ON attachments (thread_id);
CREATE INDEX attachments_pending ON attachments (created_at) WHERE status = 'pending';

-- Text derived from an artifact (sha256 set) or the caption of one reference (event_id set).
CREATE TABLE artifact_text (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sha256     text        REFERENCES artifacts (sha256),
    event_id   text,
    position   integer,
    kind       text        NOT NULL,   -- user_caption | vision_short | vision_detail | ocr | file_summary | chunk
    ord        integer     NOT NULL DEFAULT 0,
    text       text        NOT NULL,
    meta       jsonb       NOT NULL DEFAULT '{}',
    embedding  vector,
    tsv        tsvector    GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,
    CHECK ((sha256 IS NULL) <> (event_id IS NULL))
);
CREATE UNIQUE INDEX artifact_text_derived ON artifact_text (sha256, kind, ord) WHERE sha256 IS NOT NULL;
CREATE UNIQUE INDEX artifact_text_caption ON artifact_text (event_id, position, kind) WHERE event_id IS NOT NULL;
CREATE INDEX artifact_text_tsv ON artifact_text USING gin (tsv);
