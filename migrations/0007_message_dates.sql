-- Relative dates resolved when a message is projected ("yesterday" said on 8 May 2023 is
-- "7 May 2023", memory/dates.py): the absolute dates a message refers to are searchable with
-- its text, while the text shown stays as written. Messages projected before this migration
-- get theirs with a replay (`chatmem replay`).
-- depends: 0005_attachments

ALTER TABLE messages ADD COLUMN dates text NOT NULL DEFAULT '';
DROP INDEX messages_tsv;
ALTER TABLE messages DROP COLUMN tsv;
ALTER TABLE messages ADD COLUMN tsv tsvector
    GENERATED ALWAYS AS (to_tsvector('english', user_id || ' ' || text || ' ' || dates)) STORED;
CREATE INDEX messages_tsv ON messages USING gin (tsv);
