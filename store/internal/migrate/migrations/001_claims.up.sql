-- The claim table: one row per (consumer, key) whose effect committed. The
-- primary key is the whole guarantee: a second INSERT of the same pair waits
-- on an uncommitted first and then conflicts, or takes over if it rolled back.
CREATE TABLE IF NOT EXISTS {schema}.{claims} (
    consumer     text        NOT NULL,
    message_key  text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_key)
);

-- Retention deletes by age; without this index every cleanup batch would
-- scan the whole table.
CREATE INDEX IF NOT EXISTS {claims_processed_at_idx} ON {schema}.{claims} (processed_at);
