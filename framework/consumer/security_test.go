package consumer_test

import (
	"context"
	"log/slog"
	"strings"
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
	h := func(context.Context, pgx.Tx, *message.Message) error { return nil }
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
				Store: tc.cfg, Broker: brokers.Config{Kind: brokers.KindGoChannel}}, h)
			var ce *framework.ConfigError
			require.ErrorAs(t, err, &ce, "%s = %q", tc.field, name)
			require.Equal(t, tc.field, ce.Field, "%q", name)
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
	c, err := consumer.New(ctx, consumer.Config{Name: name, Topic: "orders", Key: "metadata:event_id", Pool: pool,
		Store: store.Config{Schema: schema}, Broker: bcfg, Logger: slog.New(slog.DiscardHandler)},
		func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
			_, err := tx.Exec(ctx, "INSERT INTO effects (k) VALUES ($1)", msg.Metadata.Get("event_id"))
			applied <- struct{}{}
			return err
		})
	require.NoError(t, err)
	defer c.Close()
	done := runUntilCancel(ctx, c)

	pub, err := brokers.NewPublisher(bcfg, watermill.NopLogger{})
	require.NoError(t, err)
	defer pub.Close()
	for range 2 {
		m := message.NewMessage(watermill.NewUUID(), []byte("{}"))
		m.Metadata.Set("event_id", key)
		require.NoError(t, pub.Publish("orders", m))
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
	cancel()
	require.NoError(t, <-done)
}
