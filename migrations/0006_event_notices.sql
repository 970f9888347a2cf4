-- What ingest noticed about accepted input: an event_id reused with different content (the
-- first version stays in the log; the rejected one is kept here whole) and producer clocks
-- out of range (the event is logged at ingest time; the original time is kept here and in
-- the event's metadata). A byte-identical redelivery records nothing.
-- depends: 0005_attachments

CREATE TABLE event_notices (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind         text        NOT NULL,   -- conflict | clock
    event_id     text        NOT NULL,
    stream_pos   bigint      NOT NULL,
    detail       text        NOT NULL,
    payload      jsonb,                   -- conflict: the version that was not logged
    payload_md5  text        NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (kind, event_id, payload_md5)
);
CREATE INDEX event_notices_created ON event_notices (created_at);
