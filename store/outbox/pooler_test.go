package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
	"github.com/claimtx/claimtx/store/outbox"
)

// recorder is a publisher that keeps what it was given.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Publish(_ string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		r.msgs = append(r.msgs, string(m.Payload))
	}
	return nil
}

func (r *recorder) Close() error { return nil }

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

// Behind a transaction pooler, a relay that would LISTEN refuses to run,
// saying what to do, whether or not Migrate asked the pooler question
// first; one that polls relays through the pooler.
func TestRelayBehindTransactionPooler(t *testing.T) {
	t.Parallel()
	direct, err := pgx.ParseConfig(testenv.DirectURL())
	require.NoError(t, err)
	bouncer := testenv.StartPgBouncer(t, direct.Host, int(direct.Port))
	ctx := context.Background()
	schema := testenv.NewSchema(t)
	newStore := func() *store.Store {
		pool, err := pgxpool.New(ctx, bouncer)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		st, err := store.New(pool, store.Config{Schema: schema})
		require.NoError(t, err)
		return st
	}
	migrated := newStore()
	require.NoError(t, migrated.Migrate(ctx))

	for name, st := range map[string]*store.Store{"migrated": migrated, "not migrated by this store": newStore()} {
		relay, err := outbox.New(st, &recorder{}, outbox.Config{})
		require.NoError(t, err)
		start := time.Now()
		err = relay.Run(ctx)
		require.ErrorIs(t, err, store.ErrTransactionPooler, name)
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, name)
		require.Equal(t, "DisableListen", ce.Field, name)
		require.Contains(t, err.Error(), "set DisableListen (the relay polls every PollInterval), or give the relay a Store whose pool connects to PostgreSQL directly")
		require.Less(t, time.Since(start), 10*time.Second, name)
	}

	pub := &recorder{}
	relay, err := outbox.New(migrated, pub, outbox.Config{DisableListen: true, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	stop := runRelay(t, relay.Run)
	defer stop()
	msgs := []*message.Message{testenv.Message("a", "event_id", "a"), testenv.Message("b", "event_id", "b")}
	require.NoError(t, pgx.BeginFunc(ctx, migrated.Pool(), func(tx pgx.Tx) error { return migrated.Enqueue(ctx, tx, "orders", msgs...) }))
	eventually(t, func() bool { return pub.count() == 2 }, "the polling relay publishes through the pooler")
}
