package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/kafka"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
)

// accountEvent is one event of an account, applied in seq order.
type accountEvent struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Seq     int    `json:"seq"`
}

// orderedRun is a consumer with an order key on a real broker.
type orderedRun struct {
	pool   *pgxpool.Pool
	schema string
	topic  string
	pub    message.Publisher

	mu     sync.Mutex
	broken map[string]bool
	hang   map[string]bool // events whose handler waits for its context to end
}

func (o *orderedRun) apply(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	var e accountEvent
	if err := json.Unmarshal(msg.Payload, &e); err != nil {
		return framework.Permanent(err)
	}
	o.mu.Lock()
	broken, hang := o.broken[e.ID], o.hang[e.ID]
	o.mu.Unlock()
	if broken {
		return framework.Permanent(fmt.Errorf("event %s refused", e.ID))
	}
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	_, err := tx.Exec(ctx, "INSERT INTO effects (account, seq, id) VALUES ($1, $2, $3)", e.Account, e.Seq, e.ID)
	return err
}

func (o *orderedRun) publish(t *testing.T, account string, seq int) {
	t.Helper()
	payload, err := json.Marshal(accountEvent{ID: fmt.Sprintf("%s-%d", account, seq), Account: account, Seq: seq})
	require.NoError(t, err)
	msg := message.NewMessage(fmt.Sprintf("%s-%d-%s", account, seq, randHex()), payload)
	msg.Metadata.Set(kafka.PartitionKeyMetadata, account)
	require.NoError(t, o.pub.Publish(o.topic, msg))
}

// seqs runs sql (seq of one account, in order) and returns the seqs.
func (o *orderedRun) seqs(t *testing.T, sql, account string) []int {
	t.Helper()
	rows, err := o.pool.Query(t.Context(), sql, account)
	require.NoError(t, err)
	s, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return s
}

func (o *orderedRun) applied(t *testing.T, account string) []int {
	return o.seqs(t, "SELECT seq FROM effects WHERE account = $1 ORDER BY n", account)
}

func (o *orderedRun) parked(t *testing.T, account string) []int {
	return o.seqs(t, "SELECT (convert_from(payload, 'UTF8')::jsonb->>'seq')::int FROM "+pgx.Identifier{o.schema, "processed_messages_parked"}.Sanitize()+" WHERE order_key = $1 ORDER BY id", account)
}

// TestOrderedEffectsOverBrokers: on RabbitMQ, Kafka and NATS, per message
// (and in batches on RabbitMQ and Kafka), at the
// defaults: for account K events 1..5 with event 2 refused for good and
// other accounts interleaved, 1 applies, 2..5 park in order and the other
// accounts apply; once the handler is fixed, a retry applies 2..5 in order,
// exactly once.
func TestOrderedEffectsOverBrokers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		broker string
		batch  bool
	}{{brokers.KindAMQP, false}, {brokers.KindKafka, false}, {brokers.KindNATS, false}, {brokers.KindAMQP, true}, {brokers.KindKafka, true}} {
		broker := tc.broker
		name := broker
		if tc.batch {
			name += "/batch"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, schema, ctx, cancel := effectsDB(t, 8, "n bigserial PRIMARY KEY, account text NOT NULL, seq int NOT NULL, id text NOT NULL UNIQUE")
			o := &orderedRun{pool: pool, schema: schema, topic: "ordered-" + randHex(), broken: map[string]bool{"K-2": true}}
			bcfg := brokers.Config{Kind: broker}
			if broker == brokers.KindKafka {
				br := startKafka(t)
				cl := kafkaClient(t, br)
				createTopics(t, cl, 3, nil, o.topic)
				createTopics(t, cl, 1, nil, o.topic+poisonSuffix)
				bcfg.Kafka = brokers.KafkaConfig{Brokers: br.Addrs()}
			}
			o.pub = newPublisher(t, bcfg)
			cfg := baseConfig("ledger", o.topic, pool, schema, bcfg)
			cfg.Key, cfg.OrderKey = "template:{payload.id}", "template:{payload.account}"
			rec := newRecorder()
			cfg.OnOutcome = rec.on
			reg := prometheus.NewRegistry()
			cfg.Registerer = reg
			cfg.ParkedWarnAge = time.Millisecond // any parked key is too old
			var c *consumer.Consumer
			var err error
			if tc.batch {
				// Applied in the order given, one aggregate's events in turn.
				set := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
					for _, m := range msgs {
						if err := o.apply(ctx, tx, m); err != nil {
							return err
						}
					}
					return nil
				}
				c, err = consumer.NewBatch(ctx, cfg, set, consumer.BatchOptions{MaxSize: 16})
			} else {
				c, err = consumer.New(ctx, cfg, o.apply)
			}
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			done := runUntilCancel(ctx, c)

			for seq := 1; seq <= 5; seq++ {
				for _, account := range []string{"K", "A", "B"} {
					o.publish(t, account, seq)
				}
			}
			require.Eventually(t, func() bool {
				return len(o.applied(t, "A")) == 5 && len(o.applied(t, "B")) == 5 && len(o.parked(t, "K")) == 4
			}, 60*time.Second, 50*time.Millisecond)
			require.Equal(t, []int{1}, o.applied(t, "K"))
			require.Equal(t, []int{2, 3, 4, 5}, o.parked(t, "K"))
			require.Equal(t, []int{1, 2, 3, 4, 5}, o.applied(t, "A"))
			require.Equal(t, []int{1, 2, 3, 4, 5}, o.applied(t, "B"))
			require.Eventually(t, func() bool { return rec.n(framework.Parked) == 4 }, 10*time.Second, 20*time.Millisecond,
				"the head and the three behind it are reported parked: %v", rec.snapshot())

			// Counted within the watch's 10 s: the gauges and the warning.
			require.Eventually(t, func() bool {
				return strings.HasPrefix(c.Health().Check(ctx).Checks["parked"], "warning: 1 order keys parked (4 messages)")
			}, 20*time.Second, 100*time.Millisecond, "the readiness report warns of the parked key")
			keys, err := testutil.GatherAndCount(reg, "claimtx_parked_keys")
			require.NoError(t, err)
			require.Equal(t, 1, keys)
			mfs, err := reg.Gather()
			require.NoError(t, err)
			gauges := map[string]float64{}
			for _, mf := range mfs {
				if strings.HasPrefix(mf.GetName(), "claimtx_parked_") {
					gauges[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
				}
			}
			require.Equal(t, 1.0, gauges["claimtx_parked_keys"])
			require.Equal(t, 4.0, gauges["claimtx_parked_messages"])
			require.Greater(t, gauges["claimtx_parked_oldest_seconds"], 0.0)

			o.mu.Lock()
			o.broken["K-2"] = false
			o.mu.Unlock()
			ok, err := pg.ParkingOf(c.Store()).Request(ctx, "ledger", "K", false, "test", "fixed")
			require.NoError(t, err)
			require.True(t, ok)
			require.Eventually(t, func() bool { return len(o.parked(t, "K")) == 0 }, 30*time.Second, 50*time.Millisecond)
			require.Equal(t, []int{1, 2, 3, 4, 5}, o.applied(t, "K"), "released in order, once each")

			// Released: the key flows again.
			o.publish(t, "K", 6)
			require.Eventually(t, func() bool { return len(o.applied(t, "K")) == 6 }, 30*time.Second, 50*time.Millisecond)
			stopConsumer(t, cancel, done)
		})
	}
}

// A release runs the handler within HandlerTimeout, as a delivery does: a
// handler that hangs on a parked message fails the release, which leaves
// the key parked and the releaser free, instead of holding both forever.
func TestOrderedReleaseHandlerTimeout(t *testing.T) {
	t.Parallel()
	pool, schema, ctx, cancel := effectsDB(t, 8, "n bigserial PRIMARY KEY, account text NOT NULL, seq int NOT NULL, id text NOT NULL UNIQUE")
	o := &orderedRun{pool: pool, schema: schema, topic: "ordered-timeout-" + randHex(), broken: map[string]bool{"K-2": true}, hang: map[string]bool{}}
	bcfg := brokers.Config{Kind: brokers.KindAMQP}
	o.pub = newPublisher(t, bcfg)
	cfg := baseConfig("ledger", o.topic, pool, schema, bcfg)
	cfg.Key, cfg.OrderKey = "template:{payload.id}", "template:{payload.account}"
	cfg.HandlerTimeout = time.Second
	c, err := consumer.New(ctx, cfg, o.apply)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	done := runUntilCancel(ctx, c)
	for seq := 1; seq <= 3; seq++ {
		o.publish(t, "K", seq)
	}
	require.Eventually(t, func() bool { return len(o.parked(t, "K")) == 2 }, 30*time.Second, 50*time.Millisecond)

	// Fixed, but now it hangs: the release must give up within the timeout.
	o.mu.Lock()
	o.broken["K-2"], o.hang["K-2"] = false, true
	o.mu.Unlock()
	parking := pg.ParkingOf(c.Store())
	ok, err := parking.Request(ctx, "ledger", "K", false, "test", "hangs")
	require.NoError(t, err)
	require.True(t, ok)
	require.Eventually(t, func() bool {
		k, found, err := parking.Key(ctx, "ledger", "K")
		require.NoError(t, err)
		return found && k.Failures == 2
	}, 30*time.Second, 50*time.Millisecond, "the hung release failed and was counted")
	require.Equal(t, []int{2, 3}, o.parked(t, "K"), "still parked, in order")

	// The releaser is free: once the handler returns, a release applies.
	o.mu.Lock()
	o.hang["K-2"] = false
	o.mu.Unlock()
	ok, err = parking.Request(ctx, "ledger", "K", false, "test", "fixed")
	require.NoError(t, err)
	require.True(t, ok)
	require.Eventually(t, func() bool { return len(o.parked(t, "K")) == 0 }, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, []int{1, 2, 3}, o.applied(t, "K"))
	stopConsumer(t, cancel, done)
}

// In batch mode on RabbitMQ the window that fills the batches holds later
// messages of a key whose message was just nacked for a transient failure
// (the broker puts it back at its place, behind them in the consumer's
// hands): they must wait for it, nacked behind it, and not apply first.
func TestOrderedBatchTransientNackKeepsOrder(t *testing.T) {
	t.Parallel()
	pool, schema, ctx, cancel := effectsDB(t, 8, "n bigserial PRIMARY KEY, account text NOT NULL, seq int NOT NULL, id text NOT NULL UNIQUE")
	o := &orderedRun{pool: pool, schema: schema, topic: "ordered-nack-" + randHex(), broken: map[string]bool{}}
	bcfg := brokers.Config{Kind: brokers.KindAMQP}
	bcfg.AMQP.Window = 64 // every message in hand at once
	o.pub = newPublisher(t, bcfg)
	cfg := baseConfig("ledger", o.topic, pool, schema, bcfg)
	cfg.Key, cfg.OrderKey = "template:{payload.id}", "template:{payload.account}"
	cfg.Claim.MaxAttempts = 1 // the failure reaches the broker at once
	failUntil := time.Now().Add(2 * time.Second)
	var mu sync.Mutex
	failures := 0
	set := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		for _, m := range msgs {
			var e accountEvent
			require.NoError(t, json.Unmarshal(m.Payload, &e))
			if e.ID == "K-2" && time.Now().Before(failUntil) {
				mu.Lock()
				failures++
				mu.Unlock()
				return &pgconn.PgError{Code: "40001", Message: "test: a transient failure"}
			}
			if err := o.apply(ctx, tx, m); err != nil {
				return err
			}
		}
		return nil
	}
	// Two per batch: K's later events come in later batches than K-2.
	c, err := consumer.NewBatch(ctx, cfg, set, consumer.BatchOptions{MaxSize: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	for seq := 1; seq <= 5; seq++ {
		for _, account := range []string{"K", "A"} {
			o.publish(t, account, seq)
		}
	}
	done := runUntilCancel(ctx, c)
	require.Eventually(t, func() bool {
		return len(o.applied(t, "K")) == 5 && len(o.applied(t, "A")) == 5
	}, 60*time.Second, 50*time.Millisecond)
	mu.Lock()
	require.Positive(t, failures, "K-2 failed transiently")
	mu.Unlock()
	require.Equal(t, []int{1, 2, 3, 4, 5}, o.applied(t, "K"), "K's later events waited for K-2")
	require.Equal(t, []int{1, 2, 3, 4, 5}, o.applied(t, "A"))
	stopConsumer(t, cancel, done)
}

// TestOrderedRefusesConcurrency: an order key needs one message in flight.
func TestOrderedRefusesConcurrency(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 2)
	for _, tc := range []struct {
		field string
		edit  func(*brokers.Config)
	}{
		{"Broker.AMQP.Concurrency", func(b *brokers.Config) { b.AMQP.Concurrency = 4 }},
		{"Broker.AMQP.Window", func(b *brokers.Config) { b.AMQP.Window = 16 }},
		{"Broker.Kafka.Window", func(b *brokers.Config) { b.Kind, b.Kafka.Window = brokers.KindKafka, 8 }},
		{"Broker.NATS.Concurrency", func(b *brokers.Config) { b.Kind, b.NATS.Concurrency = brokers.KindNATS, 2 }},
	} {
		var b brokers.Config
		tc.edit(&b)
		cfg := baseConfig("ledger", "ordered-"+randHex(), pool, schema, b)
		cfg.OrderKey = "template:{payload.account}"
		_, err := consumer.New(t.Context(), cfg, noop)
		requireConfigError(t, err, tc.field)
	}
	cfg := baseConfig("ledger", "ordered", pool, schema, brokers.Config{})
	cfg.OrderKey = "template:{payload."
	_, err := consumer.New(t.Context(), cfg, noop)
	requireConfigError(t, err, "OrderKey")
}

// TestOrderedLoadConfigInFlight: with ORDER_KEY the loader leaves the
// broker's in-flight settings to the order's default of one unless they
// were written, so the defaults run and an explicit larger value is refused.
func TestOrderedLoadConfigInFlight(t *testing.T) {
	for _, v := range []string{"CONCURRENCY", "CONFIG_FILE", "BROKER"} {
		t.Setenv(v, "")
		require.NoError(t, os.Unsetenv(v)) // restored by Setenv at the end
	}
	t.Setenv("ORDER_KEY", "template:{payload.account}")
	c, err := consumer.LoadConfig("")
	require.NoError(t, err)
	require.Zero(t, c.Broker.AMQP.Concurrency, "left to the order's default")
	require.Contains(t, c.String(), "Concurrency:1 ")

	t.Setenv("CONCURRENCY", "4")
	c, err = consumer.LoadConfig("")
	require.NoError(t, err)
	require.Equal(t, 4, c.Broker.AMQP.Concurrency, "written: kept, and refused by New")
}
