package claimsql

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/internal/kafkarecord"
	"github.com/claimtx/claimtx/internal/pg"
)

// Position is one Kafka partition's settled position.
type Position = kafkarecord.Settled

// PositionStatements are the statements of <schema>.kafka_positions,
// rendered once.
type PositionStatements struct {
	upsert, upsertMany, load, consumer string
	// Pool runs Of and the Loader's reads; the store sets it.
	Pool *pgxpool.Pool
}

// positionsSQL is the upsert's tail: a position only ever rises (an older
// transaction that commits late cannot lower it), and one that does not
// rise writes nothing (the row is still locked, so concurrent writers of a
// partition queue in the same order).
const positionsSQL = `
ON CONFLICT (consumer, topic, partition) DO UPDATE
SET settled_below = GREATEST(p.settled_below, EXCLUDED.settled_below), updated_at = now()
WHERE p.settled_below < EXCLUDED.settled_below`

// PositionsFor renders the position statements of schema.
func PositionsFor(schema string) *PositionStatements {
	n := pg.NewNames(schema, "", "")
	return &PositionStatements{
		upsert: n.Render(`INSERT INTO {schema}.kafka_positions AS p (consumer, topic, partition, settled_below)
VALUES ($1, $2, $3, $4)` + positionsSQL),
		// In (topic, partition) order: two transactions writing
		// overlapping partitions lock their rows in the same order.
		upsertMany: n.Render(`INSERT INTO {schema}.kafka_positions AS p (consumer, topic, partition, settled_below)
SELECT $1, t, n, s FROM unnest($2::text[], $3::int[], $4::bigint[]) AS u(t, n, s) ORDER BY t, n` + positionsSQL),
		load:     n.Render(`SELECT partition, settled_below FROM {schema}.kafka_positions WHERE consumer = $1 AND topic = $2 AND partition = ANY($3::int[])`),
		consumer: n.Render(`SELECT topic, partition, settled_below FROM {schema}.kafka_positions WHERE consumer = $1 ORDER BY topic, partition`),
	}
}

// Store raises the stored positions ps of consumer in tx with one
// statement. In the claim transaction the caller runs it last before
// COMMIT: the position rows are then its last locks, held for the commit
// only, so transactions of one partition wait for each other's commit,
// never for a handler, and cannot deadlock on them. Given a pool, it
// stores positions of records already acked.
func (s *PositionStatements) Store(ctx context.Context, tx pg.Execer, consumer string, ps []Position) error {
	if len(ps) == 0 {
		return nil
	}
	sql, args := s.upsertOf(consumer, ps)
	_, err := tx.Exec(ctx, sql, args...)
	return pg.Wrap(err, "claimtx: store kafka position")
}

// Queue queues Store's statement for ps on b, in a round trip of the
// claim transaction: with Statements.Begin for a partition with one record
// in flight, whose next record is handed out only after this ack, so the
// row lock held for the whole transaction blocks nobody; last before a
// group's COMMIT.
func (s *PositionStatements) Queue(b *pgx.Batch, consumer string, ps ...Position) {
	if len(ps) > 0 {
		sql, args := s.upsertOf(consumer, ps)
		b.Queue(sql, args...)
	}
}

// upsertOf is the statement that raises ps, one row or many.
func (s *PositionStatements) upsertOf(consumer string, ps []Position) (string, []any) {
	if len(ps) == 1 {
		return s.upsert, []any{consumer, ps[0].Topic, ps[0].Partition, ps[0].SettledBelow}
	}
	topics, parts, offs := make([]string, len(ps)), make([]int32, len(ps)), make([]int64, len(ps))
	for i, p := range ps {
		topics[i], parts[i], offs[i] = p.Topic, p.Partition, p.SettledBelow
	}
	return s.upsertMany, []any{consumer, topics, parts, offs}
}

// Of returns consumer's stored positions, by topic and partition.
func (s *PositionStatements) Of(ctx context.Context, consumer string) ([]Position, error) {
	rows, err := s.Pool.Query(ctx, s.consumer, consumer)
	var ps []Position
	if err == nil {
		ps, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Position]) // the columns in field order
	}
	return ps, pg.Wrap(err, "claimtx: read kafka positions")
}

// Loader returns the kafkarecord.Loader of consumer's stored positions.
func (s *PositionStatements) Loader(consumer string) kafkarecord.Loader {
	return loader{s, consumer}
}

type loader struct {
	s        *PositionStatements
	consumer string
}

func (l loader) LoadPositions(ctx context.Context, topic string, partitions []int32) (map[int32]int64, error) {
	rows, err := l.s.Pool.Query(ctx, l.s.load, l.consumer, topic, partitions)
	out := map[int32]int64{}
	if err == nil {
		var part int32
		var off int64
		_, err = pgx.ForEachRow(rows, []any{&part, &off}, func() error {
			out[part] = off
			return nil
		})
	}
	if err != nil {
		return nil, fmt.Errorf("claimtx: load kafka positions: %w", err)
	}
	return out, nil
}
