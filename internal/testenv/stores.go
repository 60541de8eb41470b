package testenv

// What tests and runnable examples build claims from and check them by:
// stores, each in a schema of its own, middlewares, messages, transactions,
// metrics. store's own tests are black-box (package store_test) wherever
// they need these, so testenv may import store without a cycle.

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/store"
)

// Store is a store of claimtx's default tables in a fresh schema
// (Setup) on a pool of at most maxConns connections, not migrated.
func Store(t testing.TB, maxConns int32) *store.Store {
	t.Helper()
	pool, schema := Setup(t, maxConns)
	st, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)
	return st
}

// Migrated is Store with the migrations applied.
func Migrated(t testing.TB, maxConns int32) *store.Store {
	t.Helper()
	st := Store(t, maxConns)
	require.NoError(t, st.Migrate(context.Background()))
	return st
}

// ExampleStore is Migrated for runnable examples, which have no testing.T:
// on ExamplePool, panicking on error. DropExampleStore drops it.
func ExampleStore(ctx context.Context) *store.Store {
	pool, schema := ExamplePool(ctx)
	st, err := store.New(pool, store.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	if err := st.Migrate(ctx); err != nil {
		panic(err)
	}
	return st
}

// DropExampleStore drops an ExampleStore's schema and closes its pool.
func DropExampleStore(st *store.Store) { DropExample(st.Pool(), st.Config().Schema) }

// Install builds a middleware through its constructor (middleware.NewClaim,
// NewPoison, ...), failing the test on a configuration error.
func Install[C any](t testing.TB, build func(C) (message.HandlerMiddleware, error), c C) message.HandlerMiddleware {
	t.Helper()
	mw, err := build(c)
	require.NoError(t, err)
	return mw
}

// Scalar is the one integer that sql returns, failing the test on an error.
func Scalar(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// Pairs is what sql returns, rows of a key and a value, as a map, failing
// the test on an error.
func Pairs[K comparable, V any](t testing.TB, pool *pgxpool.Pool, sql string, args ...any) map[K]V {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql, args...)
	require.NoError(t, err)
	out := map[K]V{}
	for rows.Next() {
		var k K
		var v V
		require.NoError(t, rows.Scan(&k, &v))
		out[k] = v
	}
	require.NoError(t, rows.Err())
	return out
}

// Message is a message as a producer sends it: a fresh UUID, payload, and
// the metadata given as key, value pairs.
func Message(payload string, metadata ...string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(payload))
	for i := 0; i+1 < len(metadata); i += 2 {
		m.Metadata.Set(metadata[i], metadata[i+1])
	}
	return m
}

// Begin opens a transaction on pool that is rolled back when the test
// ends, unless it was committed or rolled back before.
func Begin(t testing.TB, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// MetricSum sums, over the series of reg's metric family name whose labels
// include labels (name, value pairs), a counter's or a gauge's value or a
// histogram's sample count: 0 when no series matches.
func MetricSum(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	sum, _ := metric(t, reg, name, labels)
	return sum
}

// RequireMetric is MetricSum that fails the test when no series matches.
func RequireMetric(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	sum, found := metric(t, reg, name, labels)
	require.True(t, found, "no series %s%v", name, labels)
	return sum
}

func metric(t testing.TB, reg prometheus.Gatherer, name string, labels []string) (sum float64, found bool) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			found = true
			// Only the metric's own type is set; the others read as 0.
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, found
}
