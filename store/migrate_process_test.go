package store_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
	"github.com/claimtx/claimtx/store/internal/migrate"
)

// Environment of a child process of TestMigrateColdStartProcesses.
const (
	envMigrateChildURL = "CLAIMTX_TEST_MIGRATE_CHILD_URL"
	migrateChildReady  = "migrate-child: ready"
)

// TestMigrateColdStartProcesses runs Migrate from several processes at once
// on an empty database, as replicas of a first deploy do: each process has
// its own pool, so its own backends and catalog caches, which goroutines
// sharing one pool would not reproduce. Each child first checks the
// version the way `claimtx migrate` and health checks do (a catalog lookup
// on a pooled connection), then all are released together.
func TestMigrateColdStartProcesses(t *testing.T) {
	coldStartRounds(t, 20, 4, func(dbURL string) string { return dbURL })
}

// TestMigrateColdStartProcessesPgBouncer is the same race through a
// PgBouncer in transaction mode, where consecutive transactions of one
// client, and so a session lock and the transaction after it, run on
// different server connections: nothing of the migration may rely on a
// session.
func TestMigrateColdStartProcessesPgBouncer(t *testing.T) {
	coldStartRounds(t, 20, 4, testenv.ThroughPgBouncer(t))
}

// coldStartRounds races procs child processes' Migrate on a new database,
// rounds times; each child connects to childURL(the database's URL).
func coldStartRounds(t *testing.T, rounds, procs int, childURL func(string) string) {
	failures := 0
	for round := range rounds {
		dbURL := testenv.NewDatabase(t)
		children := make([]*migrateChild, procs)
		for i := range children {
			children[i] = startMigrateChild(t, childURL(dbURL))
		}
		for _, c := range children {
			c.awaitReady(t)
		}
		// Closing stdin is the starting gun: every child is connected and
		// blocked on its read, so the migrations overlap as much as the
		// scheduler allows.
		for _, c := range children {
			require.NoError(t, c.stdin.Close())
		}
		for i, c := range children {
			if err := c.wait(); err != nil {
				failures++
				t.Errorf("round %d, process %d: %v\n%s", round, i, err, c.output())
			}
		}
		v, err := versionOf(t, dbURL)
		require.NoError(t, err)
		require.Equal(t, migrate.Latest(), v, "round %d: schema version after the cold start", round)
	}
	t.Logf("%d of %d migrate processes failed", failures, rounds*procs)
}

// TestMigrateProcessChild is the child's side of
// TestMigrateColdStartProcesses; without its environment it does nothing.
func TestMigrateProcessChild(t *testing.T) {
	st := childStore(t, envMigrateChildURL, "TestMigrateColdStartProcesses", store.Config{}) // the default schema, absent on a new database
	ctx := context.Background()
	// Start-up as an application does it: its own DDL first (here a no-op
	// one), which warms this backend's catalog caches, then a version
	// check. A cold backend misses its caches in CREATE SCHEMA and so
	// happens to process the other processes' invalidations; a warm one
	// (a pool's connection, reused) trusts its cached "no such schema".
	_, err := st.Pool().Exec(ctx, "CREATE SCHEMA IF NOT EXISTS public")
	require.NoError(t, err)
	requireVersion(t, st, 0)
	fmt.Println(migrateChildReady)
	_, _ = io.Copy(io.Discard, os.Stdin) // wait for the parent's go
	require.NoError(t, st.Migrate(ctx))
}

type migrateChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	ready chan struct{}
	mu    sync.Mutex
	out   strings.Builder
	done  chan error
}

func startMigrateChild(t *testing.T, dbURL string) *migrateChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestMigrateProcessChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envMigrateChildURL+"="+dbURL)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = cmd.Stdout
	c := &migrateChild{cmd: cmd, stdin: stdin, ready: make(chan struct{}), done: make(chan error, 1)}
	require.NoError(t, cmd.Start())
	go func() {
		sc := bufio.NewScanner(stdout)
		readySeen := false
		for sc.Scan() {
			line := sc.Text()
			c.mu.Lock()
			c.out.WriteString(line + "\n")
			c.mu.Unlock()
			if !readySeen && line == migrateChildReady {
				readySeen = true
				close(c.ready)
			}
		}
		if !readySeen {
			close(c.ready) // exited early: wait reports why
		}
		c.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
	})
	return c
}

func (c *migrateChild) awaitReady(t *testing.T) {
	t.Helper()
	select {
	case <-c.ready:
	case <-time.After(60 * time.Second):
		t.Fatalf("migrate child never became ready:\n%s", c.output())
	}
}

func (c *migrateChild) wait() error {
	select {
	case err := <-c.done:
		if err != nil {
			return fmt.Errorf("exit: %w", err)
		}
		return nil
	case <-time.After(60 * time.Second):
		return fmt.Errorf("migrate child did not exit within 60s (pid %s)", strconv.Itoa(c.cmd.Process.Pid))
	}
}

func (c *migrateChild) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

func versionOf(t *testing.T, dbURL string) (int, error) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	st, err := store.New(pool, store.Config{})
	if err != nil {
		return 0, err
	}
	return st.Version(context.Background())
}

// TestMigrateLockWaitCancelled: a start-up interrupted while it queues for
// the migration lock (a replica stopped during a deploy) returns, leaves
// no lock behind in the pool, and the next Migrate succeeds.
func TestMigrateLockWaitCancelled(t *testing.T) {
	t.Parallel()
	st := testenv.Store(t, 2)
	ctx := context.Background()
	// A transaction lock, held by an open transaction: behind a
	// transaction pooler a session lock's unlock could run on another
	// server connection and leave the lock behind for good.
	holder, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", st.MigrationLockKeyForTest())
	require.NoError(t, err)

	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- st.Migrate(wctx) }()
	// Cancel only once Migrate is queued behind the holder.
	require.Eventually(t, func() bool {
		var waiting int
		err := holder.QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND ((classid::bigint << 32) | objid::bigint) = $1`, st.MigrationLockKeyForTest()).Scan(&waiting)
		return err == nil && waiting == 1
	}, 30*time.Second, 10*time.Millisecond, "Migrate never queued for the lock")
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(30 * time.Second):
		t.Fatal("Migrate did not return after its context was cancelled")
	}

	require.NoError(t, holder.Commit(ctx))
	require.NoError(t, st.Migrate(ctx))
	requireVersion(t, st, migrate.Latest())
	var held int
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND ((classid::bigint << 32) | objid::bigint) = $1`, st.MigrationLockKeyForTest()).Scan(&held))
	require.Zero(t, held, "migration lock still held after Migrate returned")
}
