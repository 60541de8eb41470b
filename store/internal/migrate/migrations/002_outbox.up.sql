-- The transactional outbox: messages a handler enqueued in its claim
-- transaction, published by a relay (package store/outbox) after commit.
-- A row is pending while sent_at is NULL; the relay sets sent_at only after
-- the broker confirmed the publish, and a batched cleanup deletes sent rows
-- older than the relay's retention.
CREATE TABLE IF NOT EXISTS {schema}.{outbox} (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic           text        NOT NULL,
    -- The Watermill UUID the message is published with, the same on every
    -- resend.
    uuid            text        NOT NULL,
    -- Stable across resends: published in the claimtx_idempotency_key
    -- metadata so downstream consumers drop the relay's own duplicates.
    idempotency_key text        NOT NULL,
    payload         bytea       NOT NULL,
    metadata        jsonb       NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- Failed publish attempts and the last failure, for operators.
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    sent_at         timestamptz
);

-- Relays claim the oldest pending rows: this index holds only those, so it
-- stays small however many sent rows are retained.
CREATE INDEX IF NOT EXISTS {outbox_pending_idx} ON {schema}.{outbox} (id) WHERE sent_at IS NULL;

-- Cleanup deletes sent rows by age.
CREATE INDEX IF NOT EXISTS {outbox_sent_idx} ON {schema}.{outbox} (sent_at) WHERE sent_at IS NOT NULL;
