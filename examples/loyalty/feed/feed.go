// Package feed is what a driver of the loyalty example from outside knows
// about it: its message as a plain (non-Watermill) producer sends it, the
// topics it reads and writes, the check of its tables afterwards, and how
// it creates them (examples/receipts does the same).
// examples/demo, the chaos harness (internal/chaos) and the example's own
// tests share it, so the three cannot drift apart from the consumer.
package feed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Order is the OrderCompleted payload examples/loyalty consumes.
type Order struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
	TotalCents int64 `json:"total_cents"`
}

// KafkaRecord is one message as a plain franz-go producer sends it: an
// event_id header, no Watermill metadata, keyed by the event id so copies
// of an order land on the partition of the original (as a producer's
// retry would).
func KafkaRecord(topic, eventID string, payload []byte) *kgo.Record {
	return &kgo.Record{
		Topic:   topic,
		Key:     []byte(eventID),
		Value:   payload,
		Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte(eventID)}},
	}
}

// CreateKafkaTopics creates topic with partitions partitions and its
// poison topic (topic+".poison") with one: the consumer would otherwise
// create them with the broker's defaults on first use.
func CreateKafkaTopics(ctx context.Context, adm *kadm.Client, topic string, partitions int32) error {
	if _, err := adm.CreateTopic(ctx, partitions, 1, nil, topic); err != nil {
		return fmt.Errorf("create topic: %w", err)
	}
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic+".poison"); err != nil {
		return fmt.Errorf("create poison topic: %w", err)
	}
	return nil
}

// KafkaTopicSize is the number of records ever written to topic: the
// poison topic is only written to, so that is how many were poisoned.
func KafkaTopicSize(ctx context.Context, adm *kadm.Client, topic string) (int, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	n := int64(0)
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return int(n), nil
}

// Tally is what the loyalty tables hold after a run.
type Tally struct {
	Applied    int   // distinct orders in the ledger
	LedgerRows int   // ledger rows (Applied when nothing was doubled)
	Doubled    int   // orders with more than one ledger row
	Points     int64 // sum of all balances
}

// Count reads the Tally of the loyalty tables in schema.
func Count(ctx context.Context, pool *pgxpool.Pool, schema string) (Tally, error) {
	var t Tally
	q := fmt.Sprintf(`SELECT
		(SELECT count(DISTINCT order_id) FROM %[1]s.point_ledger),
		(SELECT count(*) FROM %[1]s.point_ledger),
		(SELECT count(*) FROM (SELECT order_id FROM %[1]s.point_ledger GROUP BY order_id HAVING count(*) > 1) d),
		(SELECT coalesce(sum(points), 0) FROM %[1]s.balances)`, pgx.Identifier{schema}.Sanitize())
	err := pool.QueryRow(ctx, q).Scan(&t.Applied, &t.LedgerRows, &t.Doubled, &t.Points)
	return t, err
}

// CreateTablesOnce runs ddl (CREATE TABLE IF NOT EXISTS statements) unless
// present, a query of one boolean, says the tables exist; several instances
// (of examples/loyalty or receipts) may start at once, on an empty database
// too. present is asked first on its own: a role without CREATE must start
// against tables an operator created, and Postgres checks CREATE before IF
// NOT EXISTS. IF NOT EXISTS is not safe against a concurrent create, so
// creators queue on the advisory lock named lock, a transaction lock (a
// session lock would not hold behind a transaction pooler), and ask present
// again inside it. A backend whose catalog caches still miss the winner's
// tables (applied at transaction start, not at the lock's grant) collides,
// and a new transaction settles it.
func CreateTablesOnce(ctx context.Context, pool *pgxpool.Pool, lock, present, ddl string) error {
	var ok bool
	if err := pool.QueryRow(ctx, present).Scan(&ok); err == nil && ok {
		return nil
	}
	create := func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", lock); err != nil {
				return fmt.Errorf("advisory lock %q: %w", lock, err)
			}
			if err := tx.QueryRow(ctx, present).Scan(&ok); err != nil {
				return fmt.Errorf("check tables: %w", err)
			}
			if ok {
				return nil
			}
			if _, err := tx.Exec(ctx, ddl); err != nil {
				return fmt.Errorf("create tables: %w", err)
			}
			return nil
		})
	}
	err := create()
	// 23505: a catalog index's unique violation; 42P07: duplicate table.
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P07") {
		err = create()
	}
	return err
}

// RunID returns a short random id that keeps one run's topics, queues and
// schemas apart from every other run's.
func RunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
