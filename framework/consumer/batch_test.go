package consumer_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/kafka" // registers the kind
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// TestBatchOverBrokers: batches of up to 50 from a real broker, every order
// published twice, one undecodable message: each order applied once, the
// bad one poisoned on a poison route of the caller's (BatchOptions.Poison),
// nothing left unacked. Over RabbitMQ's per-subscription mode with a
// handler that writes one statement per message, and over both brokers'
// window mode with a set-wise handler, where batches must actually fill
// up.
func TestBatchOverBrokers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		broker   string
		window   int
		setWise  bool
		minBatch int // the largest batch seen must reach this
	}{
		{name: "amqp-subscriptions", broker: brokers.KindAMQP},
		{name: "amqp-window-set", broker: brokers.KindAMQP, window: 256, setWise: true, minBatch: 10},
		{name: "kafka-window-set", broker: brokers.KindKafka, window: 256, setWise: true, minBatch: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testBatchOverBrokers(t, tc.broker, tc.window, tc.setWise, tc.minBatch)
		})
	}
}

func testBatchOverBrokers(t *testing.T, broker string, window int, setWise bool, minBatch int) {
	pool, schema, ctx, cancel := effectsDB(t, 8, "order_id bigint NOT NULL")

	topic := "batch-test-" + randHex()
	cfg := brokers.Config{}
	cfg.Kind = broker
	cfg.AMQP.Concurrency = 64
	cfg.AMQP.Window = window
	if broker == brokers.KindKafka {
		br := startKafka(t)
		cl := kafkaClient(t, br)
		createTopics(t, cl, 2, nil, topic)
		createTopics(t, cl, 1, nil, topic+poisonSuffix)
		cfg.Kafka = brokers.KafkaConfig{Brokers: br.Addrs(), ConsumerGroup: "batch-" + topic, Window: window,
			SessionTimeout: 3 * time.Second, RebalanceTimeout: 3 * time.Second}
	}
	pub := newPublisher(t, cfg)
	poisonCfg := cfg
	poisonCfg.AMQP.Window, poisonCfg.Kafka.Window = 0, 0
	poisonCfg.Kafka.ConsumerGroup += "-poison"
	poisoned := subscribePoison(t, ctx, poisonCfg, topic)

	rec := newRecorder()
	decode := func(msg *message.Message) (int64, error) {
		var o struct {
			OrderID int64 `json:"order_id"`
		}
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return 0, framework.Permanent(err)
		}
		return o.OrderID, nil
	}
	// Everything is queued before the consumer starts, so a window lets
	// batches fill up.
	const orders = 300
	require.NoError(t, pub.Publish(topic, ordersTwice(orders, `{"order_id": `)...))

	var maxBatch atomic.Int64
	handler := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		for n := int64(len(msgs)); ; {
			m := maxBatch.Load()
			if n <= m || maxBatch.CompareAndSwap(m, n) {
				break
			}
		}
		ids := make([]int64, len(msgs))
		for i, msg := range msgs {
			id, err := decode(msg)
			if err != nil {
				return err
			}
			if !setWise {
				if _, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1)", id); err != nil {
					return err
				}
			}
			ids[i] = id
		}
		if !setWise {
			return nil
		}
		_, err := tx.Exec(ctx, "INSERT INTO effects SELECT unnest($1::bigint[])", ids)
		return err
	}
	ccfg := baseConfig("batch", topic, pool, schema, cfg)
	ccfg.Key, ccfg.OnOutcome = "json:order_id", rec.on
	c, err := consumer.NewBatch(ctx, ccfg, handler, consumer.BatchOptions{MaxSize: 50, Workers: 2, Poison: middleware.Poison{Publisher: pub, Topic: topic + poisonSuffix}})
	require.NoError(t, err)
	defer c.Close()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	m := awaitPoisoned(t, poisoned, 30*time.Second, "bad message not poisoned")
	require.Contains(t, m.Metadata.Get(middleware.PoisonReasonKey), "not valid JSON")
	require.Eventually(t, func() bool {
		return rec.n(framework.Applied) == orders && rec.n(framework.Duplicate) == orders
	}, 60*time.Second, 20*time.Millisecond)
	var n, distinct int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT order_id) FROM effects").Scan(&n, &distinct))
	require.Equal(t, orders, n)
	require.Equal(t, orders, distinct)
	require.GreaterOrEqual(t, int(maxBatch.Load()), minBatch, "the window must let batches fill up")
	stopConsumer(t, cancel, done)
}

// NewBatch builds the batch consumer from the same Config as New: over
// RabbitMQ's window, orders published twice apply once, an undecodable one
// is poisoned on the Config's poison topic, and the outcomes reach the
// metrics.
func TestNewBatch(t *testing.T) {
	t.Parallel()
	pool, schema, ctx, cancel := effectsDB(t, 8, "order_id bigint NOT NULL")
	topic := "newbatch-" + randHex()
	bcfg := brokers.Config{}
	bcfg.AMQP.Window = 256
	reg := prometheus.NewRegistry()
	rec := newRecorder()
	cfg := baseConfig("batch", topic, pool, schema, bcfg)
	cfg.Key, cfg.Registerer, cfg.OnOutcome = "json:order_id", reg, rec.on
	c, err := consumer.NewBatch(ctx, cfg, func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		ids := make([]int64, len(msgs))
		for i, msg := range msgs {
			var o struct {
				OrderID int64 `json:"order_id"`
			}
			if err := json.Unmarshal(msg.Payload, &o); err != nil {
				return framework.Permanent(err)
			}
			ids[i] = o.OrderID
		}
		_, err := tx.Exec(ctx, "INSERT INTO effects SELECT unnest($1::bigint[])", ids)
		return err
	}, consumer.BatchOptions{MaxSize: 64, Workers: 2})
	require.NoError(t, err)
	defer c.Close()

	poisonCfg := bcfg
	poisonCfg.AMQP.Window = 0
	poisoned := subscribePoison(t, ctx, poisonCfg, topic)

	const orders = 200
	require.NoError(t, c.Publisher().Publish(topic, ordersTwice(orders, `not json`)...))

	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-c.Running(): // a batch consumer signals readiness like New's
	case <-time.After(30 * time.Second):
		t.Fatal("Running not closed")
	}
	m := awaitPoisoned(t, poisoned, 30*time.Second, "bad message not poisoned")
	require.Contains(t, m.Metadata.Get(middleware.PoisonReasonKey), "not valid JSON")
	require.Eventually(t, func() bool {
		return rec.n(framework.Applied) == orders && rec.n(framework.Duplicate) == orders && rec.n(framework.Poisoned) == 1
	}, 60*time.Second, 20*time.Millisecond)
	n := queryInt(t, pool, "SELECT count(DISTINCT order_id) FROM effects WHERE true HAVING count(*) = count(DISTINCT order_id)")
	require.Equal(t, orders, n, "each order applied once")
	require.Equal(t, float64(orders), testenv.MetricSum(t, reg, "claimtx_messages_total", "outcome", "applied"))
	stopConsumer(t, cancel, done)
	require.NoError(t, c.Close())

	// What batches do not have is refused before anything connects.
	bad := cfg
	bad.Pool, bad.DatabaseURL = nil, "postgres://nobody@127.0.0.1:1/none"
	for field, edit := range map[string]func(*consumer.Config){
		"Retention":         func(c *consumer.Config) { c.Retention = time.Hour },
		"HandlerTimeout":    func(c *consumer.Config) { c.HandlerTimeout = time.Second },
		"Claim.Mode":        func(c *consumer.Config) { c.Claim.Mode = middleware.ModeNaturalKey },
		"Claim.OutboxTopic": func(c *consumer.Config) { c.Claim.OutboxTopic = "out" },
		"Claim.Fingerprint": func(c *consumer.Config) { c.Claim.Fingerprint = true },
		"Claim.Store":       func(c *consumer.Config) { c.Claim.Store = &store.Store{} },
		"Claim.EventTime": func(c *consumer.Config) {
			c.Claim.EventTime = func(*message.Message) (time.Time, error) { return time.Now(), nil }
		},
	} {
		c := bad
		edit(&c)
		_, err := consumer.NewBatch(ctx, c, perMessage(noop), consumer.BatchOptions{})
		requireConfigError(t, err, field)
	}
}
