-- A message is archived when its episode is (its final summary written): the flag moves from
-- each message row to the episode row. Setting it on the messages was an update of rows of
-- 1.9 KiB, whose new versions rarely fit their page, so each wrote a new entry into every index
-- of the table, the HNSW graph included: 7–10 ms a message at 1M messages, as much again as
-- adding the message (docs/benchmarks.md). Readers take a message's flag from its episode
-- (`message_active` in adapters/sql.py).
-- depends: 0012_scope_text_index

ALTER TABLE episodes ADD COLUMN archived boolean NOT NULL DEFAULT false;
UPDATE episodes e SET archived = true
    WHERE EXISTS (SELECT 1 FROM messages m
                  WHERE m.episode_id = e.episode_id AND m.generation = e.generation AND NOT m.is_active);
ALTER TABLE messages DROP COLUMN is_active;
