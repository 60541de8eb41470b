-- Leases: which process leads maintenance of a claim table (retention
-- cleanup, partition maintenance, the partitioning conversion), one row per
-- piece of work. A session advisory lock did this before; behind a
-- transaction pooler a session lock lands on whichever server connection
-- the pooler lends, and stays there. A lease is a row: taken when free or
-- expired, renewed (and checked) in every transaction of the run, deleted
-- at its end; a holder that died stops renewing and its lease expires. A
-- new table: creating it blocks nothing.
CREATE TABLE IF NOT EXISTS {schema}.claimtx_lease (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
);
