-- A summary reads each message as of its range's last event, edits included: the latest edit of
-- a message is looked up per line. By thread and position alone that walked every earlier event
-- of the thread, so a summary late in a long thread cost time in proportion to all of it.
-- depends: 0009_embedding_models

CREATE INDEX events_edits ON events (thread_id, (payload->>'platform_message_id'), stream_pos)
    WHERE type = 'message_edited';
