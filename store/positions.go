package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/pg"
)

// KafkaPosition is one stored Kafka position: for Consumer, the offset of
// Topic's Partition below which every record is settled (applied,
// duplicate or poisoned), raised in the claim transactions
// (middleware.Claim.NoPositions). UpdatedAt is when it last rose.
type KafkaPosition struct {
	Consumer     string
	Topic        string
	Partition    int32
	SettledBelow int64
	UpdatedAt    time.Time
}

// kafkaPositions reads every stored position, by consumer, topic and
// partition; none on a schema migrated before the table existed.
func (s *Store) kafkaPositions(ctx context.Context) ([]KafkaPosition, error) {
	rows, err := s.pool.Query(ctx, s.names.Render(`SELECT consumer, topic, partition, settled_below, updated_at
FROM {schema}.kafka_positions ORDER BY consumer, topic, partition`))
	if err == nil {
		var ps []KafkaPosition
		ps, err = pgx.CollectRows(rows, pgx.RowToStructByPos[KafkaPosition]) // the columns in field order
		if err == nil {
			return ps, nil
		}
	}
	if pg.SQLState(err) == "42P01" { // undefined_table: not migrated yet
		return nil, nil
	}
	return nil, fmt.Errorf("claimtx: stats: kafka positions: %w", err)
}
