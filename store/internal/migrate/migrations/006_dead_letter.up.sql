-- The dead-letter table: a message that had to be dead-lettered and whose
-- poisoned copy the broker refused for good (too large for it, not allowed,
-- no such destination) is kept here instead, so that the original can be
-- acked rather than redelivered forever (middleware.Poison.DeadLetters).
-- One row per refused copy, written before the original is acked: a crash
-- between the two adds a second row for the redelivery, never none.
--
-- payload and metadata are the copy the broker refused: the original's
-- bytes and headers with the poison bookkeeping (claimtx_poison_*) added.
-- A header that is not valid UTF-8 or holds a NUL byte, which jsonb cannot
-- store, is kept as {"base64": "…"}. reason is bounded like a copy's
-- (4 KiB, truncated with the length and hash of the whole text), and
-- publish_error is the broker's refusal. Rows stay until an operator deletes
-- them; nothing expires them. A new table: creating it blocks nothing.
CREATE TABLE IF NOT EXISTS {schema}.{dead_letter} (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer      text        NOT NULL,
    -- NULL when the key could not be derived (often why it was poisoned).
    message_key   text,
    -- Where it was consumed from, and the poison destination that refused it.
    topic         text        NOT NULL,
    poison_topic  text        NOT NULL,
    uuid          text        NOT NULL,
    reason        text        NOT NULL,
    permanent     boolean     NOT NULL,
    publish_error text        NOT NULL,
    payload       bytea       NOT NULL,
    metadata      jsonb       NOT NULL DEFAULT '{}',
    recorded_at   timestamptz NOT NULL DEFAULT now()
);

-- Operators list a consumer's letters newest first.
CREATE INDEX IF NOT EXISTS {dead_letter_recorded_at_idx} ON {schema}.{dead_letter} (consumer, recorded_at);
