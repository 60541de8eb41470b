// What the harness knows about the loyalty example: its message as a plain
// (non-Watermill) producer sends it, and the check of its tables
// afterwards. examples/demo keeps its own copy, so it builds outside the
// module.

package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// order is the OrderCompleted payload examples/loyalty consumes.
type order struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
	TotalCents int64 `json:"total_cents"`
}

// kafkaRecord is one message as a plain franz-go producer sends it: an
// event_id header, no Watermill metadata, keyed by the event id so copies
// of an order land on the partition of the original (as a producer's
// retry would).
func kafkaRecord(topic, eventID string, payload []byte) *kgo.Record {
	return &kgo.Record{
		Topic:   topic,
		Key:     []byte(eventID),
		Value:   payload,
		Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte(eventID)}},
	}
}

// kafkaTopicSize is the number of records ever written to topic: the
// poison topic is only written to, so that is how many were poisoned.
func kafkaTopicSize(ctx context.Context, adm *kadm.Client, topic string) (int, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	n := int64(0)
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return int(n), nil
}

// ledgerTally is what the loyalty tables hold after a run.
type ledgerTally struct {
	Applied    int   // distinct orders in the ledger
	LedgerRows int   // ledger rows (Applied when nothing was doubled)
	Doubled    int   // orders with more than one ledger row
	Points     int64 // sum of all balances
}

// countLedger reads the ledgerTally of the loyalty tables in schema.
func countLedger(ctx context.Context, pool *pgxpool.Pool, schema string) (ledgerTally, error) {
	var t ledgerTally
	q := fmt.Sprintf(`SELECT
		(SELECT count(DISTINCT order_id) FROM %[1]s.point_ledger),
		(SELECT count(*) FROM %[1]s.point_ledger),
		(SELECT count(*) FROM (SELECT order_id FROM %[1]s.point_ledger GROUP BY order_id HAVING count(*) > 1) d),
		(SELECT coalesce(sum(points), 0) FROM %[1]s.balances)`, pgx.Identifier{schema}.Sanitize())
	err := pool.QueryRow(ctx, q).Scan(&t.Applied, &t.LedgerRows, &t.Doubled, &t.Points)
	return t, err
}

// envOr returns the environment variable name, or def when it is unset or
// empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// runID returns a short random id that keeps one run's topics, queues and
// schemas apart from every other run's.
func runID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
