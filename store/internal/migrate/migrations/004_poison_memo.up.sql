-- The poison memo: a message that was dead-lettered, remembered under its
-- (consumer, key) so that its redeliveries and republished copies go to the
-- poison destination without running the handler again (Claim.PoisonMemo).
-- reason is the error that poisoned it; poisoned_at the last time a copy was
-- poisoned; seen how many copies were. Cleared by `claimtx unpoison` and the
-- dead-letter replay, removed by retention like claims. A new table: creating
-- it blocks nothing.
CREATE TABLE IF NOT EXISTS {schema}.{memo} (
    consumer    text        NOT NULL,
    message_key text        NOT NULL,
    reason      text        NOT NULL,
    poisoned_at timestamptz NOT NULL DEFAULT now(),
    seen        bigint      NOT NULL DEFAULT 1,
    PRIMARY KEY (consumer, message_key)
);

-- Retention deletes memos by age.
CREATE INDEX IF NOT EXISTS {memo_poisoned_at_idx} ON {schema}.{memo} (poisoned_at);
