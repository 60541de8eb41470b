package consumer_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// A replay of a 40-day-old event under 30-day retention is poisoned with
// outcome Expired and not applied; a current one is applied.
func TestExpiredReplayIsPoisoned(t *testing.T) {
	t.Parallel()
	pool, schema, ctx, cancel := effectsDB(t, 4, "k text NOT NULL")
	bcfg := goChannel(schema)
	eventTime, err := framework.ParseTimeSpec("metadata:event_time")
	require.NoError(t, err)
	rec := &recorder{got: map[framework.Outcome]int{}}
	c, err := consumer.New(ctx, consumer.Config{
		Name: "exp", Topic: "orders", Key: "metadata:event_id", Pool: pool, Store: store.Config{Schema: schema},
		Broker: bcfg, Claim: middleware.Claim{EventTime: eventTime}, Retention: 30 * 24 * time.Hour, OnOutcome: rec.on,
		Logger: slog.New(slog.DiscardHandler),
	}, func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1)", msg.Metadata.Get("event_id"))
		return err
	})
	require.NoError(t, err)
	defer c.Close()
	pub, sub := pubSub(t, bcfg)
	poisoned, err := sub.Subscribe(ctx, "orders.poison")
	require.NoError(t, err)
	done := runUntilCancel(ctx, c)

	old := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	old.Metadata.Set("event_id", "old")
	old.Metadata.Set("event_time", time.Now().Add(-40*24*time.Hour).UTC().Format(time.RFC3339))
	fresh := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	fresh.Metadata.Set("event_id", "fresh")
	fresh.Metadata.Set("event_time", time.Now().UTC().Format(time.RFC3339))
	require.NoError(t, pub.Publish("orders", old, fresh))

	m := awaitPoisoned(t, poisoned, 10*time.Second, "expired message not poisoned")
	require.Equal(t, "old", m.Metadata.Get("event_id"))
	require.Contains(t, m.Metadata.Get(middleware.PoisonReasonKey), "expired")
	require.Eventually(t, func() bool { return rec.n(framework.Applied) == 1 && rec.n(framework.Expired) == 1 }, 10*time.Second, 10*time.Millisecond, "%v", rec.snapshot())
	require.Zero(t, rec.n(framework.Poisoned))
	var keys []string
	rows, err := pool.Query(ctx, "SELECT k FROM effects")
	require.NoError(t, err)
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"fresh"}, keys)
	cancel()
	require.NoError(t, <-done)
}

func (r *recorder) snapshot() map[framework.Outcome]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[framework.Outcome]int{}
	for k, v := range r.got {
		out[k] = v
	}
	return out
}
