package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/nats" // registers the kind
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// TestComposedRouter runs the whole chain (Recoverer -> Poison -> Retry ->
// Claim -> handler) over the in-process broker: good messages apply once
// however often they are published, bad ones land in the poison topic with
// the reason, and a failing handler is retried then poisoned.
func TestComposedRouter(t *testing.T) {
	t.Parallel()
	pool, schema, ctx, cancel := effectsDB(t, 8, "order_id bigint NOT NULL")

	bcfg := goChannel(schema)
	rec := newRecorder()
	cfg := baseConfig("effects", "orders", pool, schema, bcfg)
	cfg.Key, cfg.RetryInitialInterval, cfg.OnOutcome = "json:order_id", time.Millisecond, rec.on
	pub, poisoned := pubPoisoned(t, ctx, bcfg, "orders")
	done := runConsumer(t, ctx, cfg, func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		var o struct {
			OrderID int64 `json:"order_id"`
			Fail    bool  `json:"fail"`
		}
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return framework.Permanent(err)
		}
		if o.Fail {
			return errors.New("handler keeps failing")
		}
		_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1)", o.OrderID)
		return err
	})

	publish := func(payload string) { require.NoError(t, pub.Publish("orders", testenv.Message(payload))) }
	published := 0
	for i := 1; i <= 20; i++ {
		for copies := 0; copies < 1+i%3; copies++ {
			publish(fmt.Sprintf(`{"order_id": %d}`, i))
			published++
		}
	}
	publish(`{"no_order_id": 1}`)
	publish(`{"order_id": 99, "fail": true}`)

	reasons := map[string]bool{}
	for len(reasons) < 2 {
		m := awaitPoisoned(t, poisoned, 10*time.Second, fmt.Sprintf("only %d poisoned messages arrived: %v", len(reasons), reasons))
		reasons[m.Metadata.Get(middleware.PoisonReasonKey)] = true
	}
	var sawKey, sawHandler bool
	for r := range reasons {
		sawKey = sawKey || strings.Contains(r, `payload "order_id"`)
		sawHandler = sawHandler || strings.Contains(r, "handler keeps failing")
	}
	require.True(t, sawKey, "%v", reasons)
	require.True(t, sawHandler, "%v", reasons)

	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM effects").Scan(&n)
		return n == 20 && rec.n(framework.Applied) == 20 && rec.n(framework.Duplicate) == published-20
	}, 10*time.Second, 10*time.Millisecond)
	distinct := queryInt(t, pool, "SELECT count(DISTINCT order_id) FROM effects")
	require.Equal(t, 20, distinct)
	require.Equal(t, 2, rec.n(framework.Poisoned))
	stopConsumer(t, cancel, done)
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Setup(t, 1)
	good := consumer.Config{Name: "c", Topic: "t", Key: "metadata:event_id", Pool: pool,
		Broker: brokers.Config{Kind: brokers.KindGoChannel}}
	for _, tc := range []struct {
		field  string
		mutate func(*consumer.Config)
	}{
		{"Name", func(c *consumer.Config) { c.Name = "" }},
		{"Topic", func(c *consumer.Config) { c.Topic = "" }},
		{"Key", func(c *consumer.Config) { c.Key = "" }},
		{"key", func(c *consumer.Config) { c.Key = "nosuch:x" }},
		{"DatabaseURL", func(c *consumer.Config) { c.Pool = nil }},
		{"DatabaseURL", func(c *consumer.Config) { c.Pool = nil; c.DatabaseURL = "postgres://u:secret@[::1" }},
		{"HandlerRetries", func(c *consumer.Config) { c.HandlerRetries = -1 }},
		{"Schema", func(c *consumer.Config) { c.Store.Schema = "bad;name" }},
		// Both ways to key at once.
		{"Key", func(c *consumer.Config) { c.Claim.Key = func(*message.Message) (string, error) { return "k", nil } }},
		// What the consumer fills itself is refused, naming the Config
		// field to use instead.
		{"Claim.Store", func(c *consumer.Config) { c.Claim.Store = &store.Store{} }},
		{"Claim.Consumer", func(c *consumer.Config) { c.Claim.Consumer = "other" }},
		{"Claim.Logger", func(c *consumer.Config) { c.Claim.Logger = watermill.NopLogger{} }},
		{"Claim.OnOutcome", func(c *consumer.Config) { c.Claim.OnOutcome = func(middleware.Result) {} }},
		// The claim's own checks name the field under Claim.
		{"Claim.MaxClaimWait", func(c *consumer.Config) { c.Claim.MaxClaimWait = -time.Second }},
		{"Claim.Isolation", func(c *consumer.Config) { c.Claim.Isolation = "read uncommitted" }},
		{"Claim.CommittedKeysTTL", func(c *consumer.Config) { c.Claim.CommittedKeysTTL = 5 * 24 * time.Hour }},
		// A committed-key entry must expire well before cleanup at
		// Retention may delete its claim.
		{"Claim.CommittedKeysTTL", func(c *consumer.Config) {
			c.Retention, c.EventTime, c.Claim.CommittedKeysTTL = time.Hour, "json:occurred_at", 31*time.Minute
		}},
	} {
		cfg := good
		tc.mutate(&cfg)
		_, err := consumer.New(context.Background(), cfg, noop)
		requireConfigError(t, err, tc.field)
		require.NotContains(t, err.Error(), "secret")
	}
	_, err := consumer.New(context.Background(), good, nil)
	require.Error(t, err)
}

// A user's own broker adapter, registered with brokers.Register, and key
// extractor, in the registry of its Config, reach a consumer: the kind and
// the spec name them as BROKER and KEY would.
func TestRegistriesInConfig(t *testing.T) {
	t.Parallel()
	pool, schema, ctx, cancel := effectsDB(t, 4, "order_id text NOT NULL")

	// The adapter: a GoChannel under another name, counting what it builds.
	inner := goChannel(schema)
	built := 0
	kind := "inhouse-" + randHex()[:8]
	register := func() {
		brokers.Register(kind, brokers.Factory{
			NewSubscriber: func(brokers.Config, watermill.LoggerAdapter) (message.Subscriber, error) {
				built++
				return brokers.NewSubscriber(inner, nil)
			},
			NewPublisher: func(brokers.Config, watermill.LoggerAdapter) (message.Publisher, error) {
				built++
				return brokers.NewPublisher(inner, nil)
			},
		})
	}
	// The extractor: "order:FIELD" keys by a payload field under a prefix.
	extractors := framework.NewRegistry()
	require.NoError(t, extractors.RegisterKey("order", func(arg string) (framework.KeyFunc, error) {
		field, err := framework.ParseKeySpec("json:" + arg)
		if err != nil {
			return nil, err
		}
		return func(m *message.Message) (string, error) {
			k, err := field(m)
			return "order/" + k, err
		}, nil
	}))

	rec := newRecorder()
	cfg := baseConfig("inhouse", "orders", pool, schema, brokers.Config{Kind: kind})
	cfg.Key, cfg.Extractors, cfg.OnOutcome = "order:order_id", extractors, rec.on
	handler := func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1)", string(msg.Payload))
		return err
	}

	// Before the kind is registered the Config names an unknown kind;
	// without the registry, an unknown extractor.
	_, err := consumer.New(ctx, cfg, handler)
	require.ErrorIs(t, err, brokers.ErrInvalidKind)
	register()
	without := cfg
	without.Extractors = nil
	_, err = consumer.New(ctx, without, handler)
	require.ErrorAs(t, err, new(*framework.ConfigError))
	require.Contains(t, err.Error(), "order")
	require.Zero(t, built)

	done := runConsumer(t, ctx, cfg, handler)
	require.Equal(t, 2, built) // subscriber and poison publisher

	pub := newPublisher(t, inner)
	for range 2 { // a duplicate with a fresh message UUID
		require.NoError(t, pub.Publish("orders", testenv.Message(`{"order_id":"A-1"}`)))
	}
	claims := pgx.Identifier{schema, "processed_messages"}.Sanitize()
	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+claims+" WHERE consumer = 'inhouse' AND message_key = 'order/A-1'").Scan(&n)
		return n == 1 && rec.n(framework.Applied) == 1 && rec.n(framework.Duplicate) == 1
	}, 10*time.Second, 10*time.Millisecond)
	stopConsumer(t, cancel, done)
	effects := queryInt(t, pool, "SELECT count(*) FROM effects")
	require.Equal(t, 1, effects)
}

// A misspelt BROKER is a configuration error before the consumer connects
// anywhere: here the database is a closed port that start-up would
// otherwise wait a minute for.
func TestUnknownBrokerKindFailsBeforeConnecting(t *testing.T) {
	t.Parallel()
	_, err := consumer.New(t.Context(), consumer.Config{
		Name: "kinds", Topic: "orders", Key: "metadata:event_id",
		DatabaseURL: "postgres://postgres@127.0.0.1:1/none", StartupTimeout: time.Minute,
		Broker: brokers.Config{Kind: "rabitmq"}, Logger: discard,
	}, noop)
	require.ErrorIs(t, err, brokers.ErrInvalidKind)
	require.Contains(t, err.Error(), "rabitmq")
	require.False(t, errors.As(err, new(*consumer.StartupError)), "%v", err)
}

// A consumer built but never run closes cleanly: a start-up that fails
// after New (a later dependency) must not turn into a close error.
func TestCloseWithoutRun(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 2)
	c, err := consumer.New(t.Context(), baseConfig("unrun", "orders", pool, schema, goChannel(schema)), noop)
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

// TestHostileIdentifiersRefused: schema and table names are spliced into
// SQL (quoted), so anything but a plain lower-case identifier is refused by
// consumer.New with a ConfigError naming the field, before any SQL runs. A
// canary table proves nothing was executed.
func TestHostileIdentifiersRefused(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 2)
	ctx := context.Background()
	_, err := pool.Exec(ctx, "CREATE TABLE users (id int)")
	require.NoError(t, err)
	hostile := []string{
		`x"; DROP TABLE users; --`, `x'; DROP TABLE users; --`, `users"."x`, "a b", "a-b", `a"b`, `a\b`, "a\nb", "a\x00b",
		"Upper", "1abc", "é", "ａ", "", " " + schema, schema + " ", strings.Repeat("a", 64), "a;b", "a/*b*/", "$1",
	}
	for _, name := range hostile {
		for _, tc := range []struct {
			field string
			cfg   store.Config
		}{
			{"Schema", store.Config{Schema: name}},
			{"ClaimsTable", store.Config{Schema: schema, ClaimsTable: name}},
			{"OutboxTable", store.Config{Schema: schema, OutboxTable: name}},
		} {
			if name == "" {
				continue // empty means the default
			}
			_, err := consumer.New(ctx, consumer.Config{Name: "c", Topic: "t", Key: "metadata:event_id", Pool: pool,
				Store: tc.cfg, Broker: brokers.Config{Kind: brokers.KindGoChannel}}, noop)
			requireConfigError(t, err, tc.field, "%s = %q", tc.field, name)
		}
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM users").Scan(&n), "the canary table is still there")
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = $1", schema).Scan(&n))
	require.Equal(t, 1, n, "nothing but the canary was created")
}

// TestHostileConsumerNameAndKeyAreData: the consumer name and the message
// key are bound parameters, so SQL in them is stored verbatim and never
// executed.
func TestHostileConsumerNameAndKeyAreData(t *testing.T) {
	t.Parallel()
	pool, schema, ctx, cancel := effectsDB(t, 4, "k text NOT NULL")

	name := `loyalty'); DROP TABLE effects; --`
	key := `k'); DELETE FROM effects; --`
	bcfg := goChannel(schema)
	applied := make(chan struct{}, 2)
	done := runConsumer(t, ctx, baseConfig(name, "orders", pool, schema, bcfg),
		func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
			_, err := tx.Exec(ctx, "INSERT INTO effects (k) VALUES ($1)", msg.Metadata.Get("event_id"))
			applied <- struct{}{}
			return err
		})

	pub := newPublisher(t, bcfg)
	for range 2 {
		require.NoError(t, pub.Publish("orders", testenv.Message("{}", "event_id", key)))
	}
	select {
	case <-applied:
	case <-time.After(10 * time.Second):
		t.Fatal("the message was not applied")
	}
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "processed_messages"}.Sanitize()+" WHERE consumer = $1 AND message_key = $2", name, key).Scan(&n)
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "the claim stores the name and key verbatim")
	var k string
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT min(k), count(*) FROM effects").Scan(&k, &n), "effects still exists")
	require.Equal(t, key, k)
	require.Equal(t, 1, n)
	stopConsumer(t, cancel, done)
}

// TestAwaitDatabase: the user's own start-up step runs under the
// consumer's policy: once when the database is there, not at all without
// a pool, and a failure waiting cannot fix comes back at once as a
// *StartupError naming the step.
func TestAwaitDatabase(t *testing.T) {
	pool, _ := testenv.Setup(t, 2)
	calls := 0
	err := consumer.AwaitDatabase(t.Context(), consumer.Config{Pool: pool}, "create my tables", func(context.Context) error {
		calls++
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, calls)

	var cfgErr *framework.ConfigError
	require.ErrorAs(t, consumer.AwaitDatabase(t.Context(), consumer.Config{}, "create my tables", func(context.Context) error { return nil }), &cfgErr)

	boom := errors.New("boom")
	err = consumer.AwaitDatabase(t.Context(), consumer.Config{Pool: pool, StartupTimeout: time.Minute}, "create my tables", func(context.Context) error { return boom })
	var se *consumer.StartupError
	require.ErrorAs(t, err, &se)
	require.Equal(t, "create my tables", se.Step)
	require.Equal(t, 1, se.Attempts)
	require.ErrorIs(t, err, boom)
}

// TestKafkaDefaultGroupPerConsumer is the usual fan-out: two services
// (different consumer names) read the same topic, neither sets a consumer
// group. Each must see every message. A shared default group would make
// them split the partitions, each missing the other's half.
func TestKafkaDefaultGroupPerConsumer(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 8)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	br := startKafka(t)
	topic := "fanout-" + randHex()
	cl := kafkaClient(t, br, kgo.ProducerLinger(0))
	// Two partitions, so a shared group has something to split.
	createTopics(t, cl, 2, nil, topic)
	const n = 20
	for i := range n {
		require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{
			Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: []byte(`{}`),
			Headers: []kgo.RecordHeader{{Key: "event_id", Value: fmt.Appendf(nil, "evt-%d", i)}},
		}).FirstErr())
	}

	// No ConsumerGroup: the defaults, as brokers.LoadConfig("") gives them
	// without KAFKA_CONSUMER_GROUP.
	requireEachSeesAll(t, ctx, pool, schema, topic, fastKafka(br.Addrs(), ""), n)
}

// requireEachSeesAll runs the consumers loyalty and analytics on topic over
// bcfg and requires each to see all n messages (event_id evt-0 to evt-n-1)
// already there.
func requireEachSeesAll(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema, topic string, bcfg brokers.Config, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type seen struct {
		sync.Mutex
		ids map[string]bool
	}
	names := []string{"loyalty", "analytics"}
	got := map[string]*seen{}
	done := make(chan error, len(names))
	for _, name := range names {
		s := &seen{ids: map[string]bool{}}
		got[name] = s
		c, err := consumer.New(ctx, baseConfig(name, topic, pool, schema, bcfg), func(_ context.Context, _ pgx.Tx, msg *message.Message) error {
			s.Lock()
			defer s.Unlock()
			s.ids[msg.Metadata.Get("event_id")] = true
			return nil
		})
		require.NoError(t, err)
		defer c.Close()
		go func() { done <- c.Run(ctx) }()
	}
	count := func(name string) int {
		s := got[name]
		s.Lock()
		defer s.Unlock()
		return len(s.ids)
	}
	// A shared group would split the partitions and leave each consumer
	// short of n for good: the wait is the assertion (the sets cannot
	// grow past n, so a later look would prove nothing).
	require.Eventually(t, func() bool { return count("loyalty") == n && count("analytics") == n },
		30*time.Second, 50*time.Millisecond, "each consumer sees all %d messages", n)
	cancel()
	for range names {
		require.NoError(t, <-done)
	}
}

// The NATS durable defaults to the consumer's name too, for the same
// reason; a name JetStream cannot take as a durable leaves it to
// NATS_DURABLE, which the error names.
func TestNATSDefaultDurablePerConsumer(t *testing.T) {
	pool, schema := testenv.Setup(t, 8)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t.Setenv("BROKER", brokers.KindNATS)
	bcfg, err := brokers.LoadConfig("") // no NATS_DURABLE
	require.NoError(t, err)
	bcfg.NATS.AckWait = 2 * time.Second
	topic := "fanout-" + randHex()
	t.Cleanup(func() { deleteNATSStreams(t, topic) })
	const n = 20
	pub := newPublisher(t, bcfg)
	for i := range n {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set("event_id", fmt.Sprintf("evt-%d", i))
		require.NoError(t, pub.Publish(topic, m))
	}
	requireEachSeesAll(t, ctx, pool, schema, topic, bcfg, n)

	_, err = consumer.New(ctx, baseConfig("billing v2", topic, pool, schema, bcfg), noop)
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "NATS_DURABLE", ce.Field, "%v", err)
}

// deleteNATSStreams deletes the streams of subject topic and its poison
// subject, as the adapter named them.
func deleteNATSStreams(t *testing.T, topic string) {
	nc, err := natsgo.Connect(natsgo.DefaultURL)
	require.NoError(t, err)
	defer nc.Close()
	js, err := nc.JetStream()
	require.NoError(t, err)
	for _, name := range []string{topic, topic + "_poison"} {
		_ = js.DeleteStream(name)
	}
}

// StartupTimeout bounds every broker's start-up, NATS's too: a NATS server
// that is not there fails New after about StartupTimeout, not after the
// adapter's own 30 s DialTimeout.
func TestStartupTimeoutBoundsNATSDial(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 2)
	cfg := baseConfig("natsdial", "orders", pool, schema, brokers.Config{Kind: brokers.KindNATS,
		NATS: brokers.NATSConfig{URL: "nats://127.0.0.1:1"}})
	cfg.StartupTimeout = time.Second
	start := time.Now()
	_, err := consumer.New(t.Context(), cfg, noop)
	require.Error(t, err)
	require.Less(t, time.Since(start), 15*time.Second, "start-up waited past StartupTimeout: %v", err)
}
