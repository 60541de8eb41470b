package consumer_test

import (
	"context"
	"errors"
	"log/slog"
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
	"github.com/claimtx/claimtx/store"
)

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

	rec := &recorder{got: map[framework.Outcome]int{}}
	cfg := consumer.Config{
		Name: "inhouse", Topic: "orders", Key: "order:order_id", Pool: pool,
		Store: store.Config{Schema: schema}, Broker: brokers.Config{Kind: kind},
		Extractors: extractors, Logger: slog.New(slog.DiscardHandler),
		OnOutcome: rec.on,
	}
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
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Contains(t, err.Error(), "order")
	require.Zero(t, built)

	c, err := consumer.New(ctx, cfg, handler)
	require.NoError(t, err)
	defer c.Close()
	done := runUntilCancel(ctx, c)
	require.Equal(t, 2, built) // subscriber and poison publisher

	pub, err := brokers.NewPublisher(inner, nil)
	require.NoError(t, err)
	defer pub.Close()
	for range 2 { // a duplicate with a fresh message UUID
		require.NoError(t, pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"A-1"}`))))
	}
	claims := pgx.Identifier{schema, "processed_messages"}.Sanitize()
	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+claims+" WHERE consumer = 'inhouse' AND message_key = 'order/A-1'").Scan(&n)
		return n == 1 && rec.n(framework.Applied) == 1 && rec.n(framework.Duplicate) == 1
	}, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	var effects int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM effects").Scan(&effects))
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
		Broker: brokers.Config{Kind: "rabitmq"}, Logger: slog.New(slog.DiscardHandler),
	}, func(context.Context, pgx.Tx, *message.Message) error { return nil })
	require.ErrorIs(t, err, brokers.ErrInvalidKind)
	require.Contains(t, err.Error(), "rabitmq")
	require.False(t, errors.As(err, new(*consumer.StartupError)), "%v", err)
}

// A consumer built but never run closes cleanly: a start-up that fails
// after New (a later dependency) must not turn into a close error.
func TestCloseWithoutRun(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 2)
	c, err := consumer.New(t.Context(), consumer.Config{
		Name: "unrun", Topic: "orders", Key: "metadata:event_id", Pool: pool,
		Store: store.Config{Schema: schema}, Broker: goChannel(schema), Logger: slog.New(slog.DiscardHandler),
	}, func(context.Context, pgx.Tx, *message.Message) error { return nil })
	require.NoError(t, err)
	require.NoError(t, c.Close())
}
