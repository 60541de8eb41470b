-- Kafka positions stored with the claims: for each (consumer, topic,
-- partition), the offset below which every record is settled (applied,
-- duplicate or poisoned). The claim transaction raises it (GREATEST, so an
-- older transaction committing late never lowers it) in the same commit as
-- the claims and effects it covers; on assignment the Kafka subscriber
-- starts a partition there when the group's committed offset is below it.
-- One small row per partition, updated in place; retention and partition
-- maintenance leave it alone. A new table: creating it blocks nothing.
CREATE TABLE IF NOT EXISTS {schema}.kafka_positions (
    consumer      text        NOT NULL,
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    settled_below bigint      NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition)
);
