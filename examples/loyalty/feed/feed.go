// Package feed is what a driver of the loyalty example from outside knows
// about it: its message as a plain (non-Watermill) producer sends it, the
// topics it reads and writes, and the check of its tables afterwards.
// examples/demo, the chaos harness (internal/chaos) and the example's own
// tests share it, so the three cannot drift apart from the consumer.
package feed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/jackc/pgx/v5"
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

// RunID returns a short random id that keeps one run's topics, queues and
// schemas apart from every other run's.
func RunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
