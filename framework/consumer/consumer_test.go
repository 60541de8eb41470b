package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

type recorder struct {
	mu  sync.Mutex
	got map[framework.Outcome]int
}

func (r *recorder) on(res middleware.Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got[res.Outcome]++
}

func (r *recorder) n(o framework.Outcome) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[o]
}

// goChannel is an in-process broker private to the test's schema that
// keeps what is published before anyone subscribes.
func goChannel(schema string) brokers.Config {
	bcfg := brokers.Config{}
	bcfg.Kind = brokers.KindGoChannel
	bcfg.GoChannel.Name = schema
	bcfg.GoChannel.Persistent = true
	return bcfg
}

// awaitPoisoned returns the next message on poisoned, acked, or fails the
// test with failure after wait.
func awaitPoisoned(t *testing.T, poisoned <-chan *message.Message, wait time.Duration, failure string) *message.Message {
	t.Helper()
	select {
	case m := <-poisoned:
		m.Ack()
		return m
	case <-time.After(wait):
		t.Fatal(failure)
		return nil
	}
}

// ordersTwice is n orders ({"order_id": i}), each published twice, and one
// message with the payload bad.
func ordersTwice(n int, bad string) []*message.Message {
	var msgs []*message.Message
	for range 2 {
		for i := 1; i <= n; i++ {
			msgs = append(msgs, message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order_id": %d}`, i))))
		}
	}
	return append(msgs, message.NewMessage(watermill.NewUUID(), []byte(bad)))
}

// TestComposedRouter runs the whole chain (Recoverer -> Poison -> Retry ->
// Claim -> handler) over the in-process broker: good messages apply once
// however often they are published, bad ones land in the poison topic with
// the reason, and a failing handler is retried then poisoned.
func TestComposedRouter(t *testing.T) {
	t.Parallel()
	pool, schema, ctx, cancel := effectsDB(t, 8, "order_id bigint NOT NULL")

	bcfg := goChannel(schema)
	rec := &recorder{got: map[framework.Outcome]int{}}
	c, err := consumer.New(ctx, consumer.Config{
		Name: "effects", Topic: "orders", Key: "json:order_id", Pool: pool,
		Store: store.Config{Schema: schema}, Broker: bcfg,
		RetryInitialInterval: time.Millisecond, OnOutcome: rec.on,
		Logger: slog.New(slog.DiscardHandler),
	}, func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
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
	require.NoError(t, err)
	defer c.Close()

	pub, sub := pubSub(t, bcfg)
	poisoned, err := sub.Subscribe(ctx, "orders.poison")
	require.NoError(t, err)

	done := runUntilCancel(ctx, c)

	publish := func(payload string) {
		require.NoError(t, pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(payload))))
	}
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
	var distinct int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(DISTINCT order_id) FROM effects").Scan(&distinct))
	require.Equal(t, 20, distinct)
	require.Equal(t, 2, rec.n(framework.Poisoned))

	cancel()
	require.NoError(t, <-done)
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Setup(t, 1)
	good := consumer.Config{Name: "c", Topic: "t", Key: "metadata:event_id", Pool: pool,
		Broker: brokers.Config{Kind: brokers.KindGoChannel}}
	h := func(context.Context, pgx.Tx, *message.Message) error { return nil }
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
		_, err := consumer.New(context.Background(), cfg, h)
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, tc.field)
		require.Equal(t, tc.field, ce.Field)
		require.NotContains(t, err.Error(), "secret")
	}
	_, err := consumer.New(context.Background(), good, nil)
	require.Error(t, err)
}
