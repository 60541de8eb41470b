package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ConsumerStats describes one consumer's claims.
type ConsumerStats struct {
	Consumer string
	Claims   int64
	// Oldest and Newest are the earliest and latest processed_at.
	Oldest, Newest time.Time
}

// Stats describes the claim table, for sizing and retention decisions.
type Stats struct {
	Partitioned bool            // partitioned by event day
	Partitions  int             // 0 for a plain table
	Consumers   []ConsumerStats // ordered by consumer name
	Claims      int64           // in total
	// TableBytes is the size of the rows (heap and TOAST, all partitions);
	// IndexBytes the size of every index on them.
	TableBytes, IndexBytes int64
	// BytesPerClaim is (TableBytes+IndexBytes)/Claims, dead space
	// included: times message rate and retention, the table's size.
	BytesPerClaim float64
	// KafkaPositions are the stored Kafka positions of every consumer of
	// the schema, by consumer, topic and partition.
	KafkaPositions []KafkaPosition
}

// Stats reads per-consumer claim counts and the table's size. The counts
// scan the whole table (every partition): run it from the operator CLI,
// not from a health check.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	kind, err := s.claimTableKind(ctx, s.pool)
	if err != nil {
		return st, err
	}
	st.Partitioned = kind == "p"
	rows, err := s.pool.Query(ctx, s.names.Render(`SELECT consumer, count(*), min(processed_at), max(processed_at)
FROM {schema}.{claims} GROUP BY consumer ORDER BY consumer`))
	if err == nil {
		st.Consumers, err = pgx.CollectRows(rows, pgx.RowToStructByPos[ConsumerStats]) // the columns in field order
	}
	if err != nil {
		return st, fmt.Errorf("claimtx: stats: %w", err)
	}
	for _, c := range st.Consumers {
		st.Claims += c.Claims
	}
	// pg_partition_tree lists nothing for a plain table: size the table.
	err = s.pool.QueryRow(ctx, `WITH leaves AS (
    SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf
    UNION ALL
    SELECT $1::regclass WHERE NOT EXISTS (SELECT 1 FROM pg_partition_tree($1::regclass))
)
SELECT coalesce(sum(pg_table_size(relid)), 0)::bigint, coalesce(sum(pg_indexes_size(relid)), 0)::bigint, count(*)
FROM leaves`, s.names.Render("{schema}.{claims}")).Scan(&st.TableBytes, &st.IndexBytes, &st.Partitions)
	if err != nil {
		return st, fmt.Errorf("claimtx: stats: table size: %w", err)
	}
	if !st.Partitioned {
		st.Partitions = 0
	}
	if st.Claims > 0 {
		st.BytesPerClaim = float64(st.TableBytes+st.IndexBytes) / float64(st.Claims)
	}
	if st.KafkaPositions, err = s.kafkaPositions(ctx); err != nil {
		return st, err
	}
	return st, nil
}
