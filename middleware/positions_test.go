package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/kafka"
	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
	"github.com/claimtx/claimtx/internal/kafkarecord"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
)

// kafkaOrders publishes ords to a fresh one-partition topic on a dev
// broker and returns a subscription to it with a window of window
// records in flight.
func kafkaOrders(t *testing.T, window int, ords ...order) (message.Subscriber, <-chan *message.Message, string) {
	t.Helper()
	br, err := kafkatest.Start(t.Context(), kafkatest.Options{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = br.Close() })
	topic := testenv.UniqueName(t, 40)
	cl, err := kgo.NewClient(kgo.SeedBrokers(br.Addrs()...))
	require.NoError(t, err)
	defer cl.Close()
	_, err = kadm.NewClient(cl).CreateTopic(t.Context(), 1, 1, nil, topic)
	require.NoError(t, err)
	for _, o := range ords {
		payload, err := json.Marshal(o)
		require.NoError(t, err)
		id := fmt.Sprintf("evt-%d", o.OrderID)
		require.NoError(t, cl.ProduceSync(t.Context(), &kgo.Record{Topic: topic, Key: []byte(id), Value: payload,
			Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte(id)}}}).FirstErr())
	}
	sub, err := kafka.NewSubscriber(context.Background(), brokers.KafkaConfig{
		Brokers: br.Addrs(), ConsumerGroup: topic, Window: window,
		SessionTimeout: 2 * time.Second, HeartbeatInterval: 100 * time.Millisecond, RebalanceTimeout: 3 * time.Second,
	}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(t.Context(), topic)
	require.NoError(t, err)
	return sub, msgs, topic
}

func (b bundle) position(t *testing.T, consumer, topic string) int64 {
	t.Helper()
	var off int64
	err := b.pool.QueryRow(context.Background(), fmt.Sprintf(
		"SELECT settled_below FROM %s.kafka_positions WHERE consumer = $1 AND topic = $2 AND partition = 0",
		pgx.Identifier{b.schema}.Sanitize()), consumer, topic).Scan(&off)
	if errors.Is(err, pgx.ErrNoRows) {
		return -1
	}
	require.NoError(t, err)
	return off
}

func receiveN(t *testing.T, msgs <-chan *message.Message, n int) []*message.Message {
	t.Helper()
	out := make([]*message.Message, 0, n)
	for len(out) < n {
		select {
		case m := <-msgs:
			out = append(out, m)
		case <-time.After(15 * time.Second):
			t.Fatalf("got %d of %d messages", len(out), n)
		}
	}
	return out
}

// TestKafkaPositionStoredWithClaim: per message, in the claim-table and
// the natural-key mode, each claim transaction stores its partition's
// settled position, duplicates included (a natural-key duplicate rolls
// back, so its position is stored on its own; one the committed-key cache
// answers has no transaction and stores nothing); a failed transaction
// stores nothing; NoPositions stores nothing.
func TestKafkaPositionStoredWithClaim(t *testing.T) {
	t.Parallel()
	ords := []order{{1, 1, 100}, {2, 2, 200}, {1, 1, 100}, {3, 3, 300}}
	for _, mode := range []string{"claim table", "claim table, window 3", "natural key", "no positions"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			var b bundle
			var c middleware.Claim
			effect := credit
			switch mode {
			case "natural key":
				b = naturalSetup(t, 4)
				c = b.natural(t, nil)
				effect = creditOnce
			default:
				b = setup(t, 4)
				c = b.claim(t, "loyalty", nil)
				c.NoPositions = mode == "no positions"
			}
			h := testenv.Install(t, middleware.NewClaim, c)(consume(effect))
			window := 1 // the position goes out with the claim
			if mode == "claim table, window 3" {
				window = 3 // last before COMMIT
			}
			_, msgs, topic := kafkaOrders(t, window, ords...)
			for i := range ords {
				m := receiveN(t, msgs, 1)[0]
				_, err := h(m)
				require.NoError(t, err)
				want := int64(i + 1)
				switch {
				case mode == "no positions":
					want = -1
				case strings.HasPrefix(mode, "claim table") && i == 2:
					// The committed-key cache answered the duplicate:
					// no transaction, so nothing stored until the next.
					want = 2
				}
				require.Equal(t, want, b.position(t, c.Consumer, topic), "after offset %d", i)
				require.True(t, m.Ack())
				if window > 1 {
					// The subscriber takes the ack in on its own
					// goroutine; the next claim's position counts it
					// only once it has.
					rec, ok := kafkarecord.FromContext(m.Context())
					require.True(t, ok)
					require.Eventually(t, func() bool {
						off, ok := rec.Of.SettledBelow(nil)
						return ok && off >= int64(i+1)
					}, 5*time.Second, time.Millisecond)
				}
			}
			require.EqualValues(t, 1, b.ledgerRows(t, 1))
			// A failing transaction rolls its position back with it.
			if mode == "claim table" {
				_, msgs, topic := kafkaOrders(t, 1, order{4, 4, 400})
				m := receiveN(t, msgs, 1)[0]
				fail := testenv.Install(t, middleware.NewClaim, c)(consume(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
					if err := credit(ctx, tx, msg); err != nil {
						return err
					}
					return fmt.Errorf("handler failed")
				}))
				_, err := fail(m)
				require.Error(t, err)
				require.EqualValues(t, -1, b.position(t, c.Consumer, topic))
			}
		})
	}
}

// TestKafkaPositionBatchWindow: batches of one partition with a window of
// records in flight store the low-water mark, not the last offset: a
// batch committing while an earlier record is unsettled stores that
// record's offset, and the batch that settles it stores the end.
func TestKafkaPositionBatchWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	c := b.claim(t, "loyalty", nil)
	bt, err := middleware.NewBatch(c)
	require.NoError(t, err)
	var ords []order
	for i := range 8 {
		ords = append(ords, order{int64(i + 1), int64(i%3 + 1), 100})
	}
	_, msgs, topic := kafkaOrders(t, 8, ords...)
	all := receiveN(t, msgs, len(ords))
	ctx := context.Background()
	process := func(ms []*message.Message) {
		t.Helper()
		for _, err := range bt.Process(ctx, ms, creditSet) {
			require.NoError(t, err)
		}
	}
	// Offsets 4..7 first, 0..3 unsettled: the position stays at 0.
	process(all[4:])
	require.EqualValues(t, 0, b.position(t, c.Consumer, topic))
	for _, m := range all[4:] {
		require.True(t, m.Ack())
	}
	// 0..2: below 3, the lowest record in flight.
	process(all[:3])
	require.EqualValues(t, 3, b.position(t, c.Consumer, topic))
	for _, m := range all[:3] {
		require.True(t, m.Ack())
	}
	// The subscriber takes acks in on its own goroutine: wait until every
	// record but 3 counts as settled, or the last batch stores 3.
	rec, ok := kafkarecord.FromContext(all[3].Context())
	require.True(t, ok)
	require.Eventually(t, func() bool {
		off, ok := rec.Of.SettledBelow([]int64{3})
		return ok && off == 8
	}, 5*time.Second, time.Millisecond)
	// 3 with a duplicate of 0 (a twin in the batch): the end.
	process([]*message.Message{all[3], newDelivery(t, ords[0])})
	require.EqualValues(t, 8, b.position(t, c.Consumer, topic))
	require.EqualValues(t, 8, b.scalar(t, "SELECT count(*) FROM point_ledger"))
}

// TestBatchNoPositions: a batch of Kafka records with NoPositions commits
// its claims and stores no position (the store's positions are nil then).
func TestBatchNoPositions(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	c := b.claim(t, "loyalty", nil)
	c.NoPositions = true
	bt, err := middleware.NewBatch(c)
	require.NoError(t, err)
	ords := []order{{1, 1, 100}, {2, 2, 100}}
	_, msgs, topic := kafkaOrders(t, len(ords), ords...)
	for _, err := range bt.Process(context.Background(), receiveN(t, msgs, len(ords)), creditSet) {
		require.NoError(t, err)
	}
	require.EqualValues(t, 2, b.scalar(t, "SELECT count(*) FROM point_ledger"))
	require.EqualValues(t, -1, b.position(t, c.Consumer, topic))
}
