-- Lineage: the id of the transaction that wrote each claim and outbox row,
-- so `claimtx explain` can list the outbox rows a claim's transaction wrote.
--
-- Online on existing tables, in two steps: a column added without a default
-- is a catalog change only (no rewrite, existing rows read NULL: "unknown
-- transaction"), and a default set afterwards applies to new rows only.
-- Both take the table's lock for an instant. On a claim table partitioned
-- by event day, ALTER TABLE on the parent reaches every partition, and new
-- day partitions copy the column and its default (LIKE … INCLUDING ALL).
ALTER TABLE {schema}.{claims} ADD COLUMN IF NOT EXISTS xact xid8;
ALTER TABLE {schema}.{claims} ALTER COLUMN xact SET DEFAULT pg_current_xact_id();
ALTER TABLE {schema}.{outbox} ADD COLUMN IF NOT EXISTS xact xid8;
ALTER TABLE {schema}.{outbox} ALTER COLUMN xact SET DEFAULT pg_current_xact_id();
