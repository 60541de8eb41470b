package migrate_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store/internal/migrate"
)

// TestUpAfterPredecessorCreatedSchema is the cold-start race made
// deterministic: this backend caches "no such schema", begins its
// migrating transaction and queues for the lock while another holds it and
// creates the schema; when the other commits, the catalog change is not yet
// in this backend's caches. Up must still see the schema (no duplicate key
// in pg_namespace_nspname_index). The predecessor's change is small on
// purpose: a whole migration's worth of invalidations overflows the queue
// and makes Postgres catch every backend up, which hides the race.
func TestUpAfterPredecessorCreatedSchema(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := testenv.NewSchema(t)
	holder, err := pgx.Connect(ctx, testenv.URL())
	require.NoError(t, err)
	defer func() { _ = holder.Close(ctx) }()
	_, err = holder.Exec(ctx, "DROP SCHEMA "+pg.Ident(schema))
	require.NoError(t, err)
	n := pg.NewNames(schema, "processed_messages", "outbox")

	// One connection: the warm-up, the fast path and the migrating
	// transaction share a backend (directly; a pooler may not keep that).
	cfg, err := pgxpool.ParseConfig(testenv.URL())
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()

	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrate.LockKey(schema))
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "CREATE SCHEMA "+pg.Ident(schema))
	require.NoError(t, err)

	v, err := migrate.Version(ctx, pool, n) // caches the schema's absence
	require.NoError(t, err)
	require.Zero(t, v)
	done := make(chan error, 1)
	go func() { done <- migrate.Up(ctx, pool, n) }()
	require.Eventually(t, func() bool {
		var waiting int
		err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND ((classid::bigint << 32) | objid::bigint) = $1`, migrate.LockKey(schema)).Scan(&waiting)
		return err == nil && waiting == 1
	}, 30*time.Second, 10*time.Millisecond, "Up never queued for the lock")
	require.NoError(t, tx.Commit(ctx))

	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("Up did not return")
	}
	v, err = migrate.Version(ctx, pool, n)
	require.NoError(t, err)
	require.Equal(t, migrate.Latest(), v)
}
