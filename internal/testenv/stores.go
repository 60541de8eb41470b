package testenv

// The claimtx stores that tests and runnable examples start from, each in
// a schema of its own. store's own tests are black-box (package store_test)
// wherever they need these, so testenv may import store without a cycle.

import (
	"context"
	"testing"

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
