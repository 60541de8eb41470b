package store_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// leaseStores returns two Stores, as two instances have, on one migrated
// schema: each through its own pool, directly or through a PgBouncer in
// transaction mode of the test's own.
func leaseStores(t *testing.T, pooled bool) (a, b *store.Store) {
	t.Helper()
	raw := testenv.DirectURL()
	if pooled {
		direct := directConfig(t)
		raw = testenv.StartPgBouncer(t, direct.Host, int(direct.Port))
	}
	schema := testenv.NewSchema(t)
	var stores [2]*store.Store
	for i := range stores {
		pool, err := pgxpool.New(context.Background(), raw)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		stores[i], err = store.New(pool, store.Config{Schema: schema})
		require.NoError(t, err)
	}
	require.NoError(t, stores[0].Migrate(context.Background()))
	return stores[0], stores[1]
}

// forBothConnections runs test on two stores sharing one schema, connected
// directly and then behind a transaction pooler: the lease must fence both.
func forBothConnections(t *testing.T, test func(t *testing.T, a, b *store.Store)) {
	for _, pooled := range []bool{false, true} {
		name := "direct"
		if pooled {
			name = "pgbouncer"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a, b := leaseStores(t, pooled)
			test(t, a, b)
		})
	}
}

func leaseTable(st *store.Store) string {
	return pgx.Identifier{st.Config().Schema, "claimtx_lease"}.Sanitize()
}

// takeOverLease gives the retention lease to another instance, as when a
// run stalls past the lease's time to live and another takes it.
func takeOverLease(t *testing.T, st *store.Store) {
	t.Helper()
	_, err := st.Pool().Exec(context.Background(), "UPDATE "+leaseTable(st)+" SET holder = 'another instance' WHERE name = $1", st.RetentionLeaseNameForTest())
	require.NoError(t, err)
}

func leaseHolder(t *testing.T, st *store.Store) string {
	t.Helper()
	var holder string
	err := st.Pool().QueryRow(context.Background(), "SELECT holder FROM "+leaseTable(st)+" WHERE name = $1",
		st.RetentionLeaseNameForTest()).Scan(&holder)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	require.NoError(t, err)
	return holder
}

// Two instances compete: while one runs a Cleanup, the other's retention
// operations all return ErrNotLeader at once; once it is done, the other
// leads. Directly and behind a transaction pooler, where a session lock
// would have landed on an arbitrary server connection.
func TestRetentionLeaseTwoStoresCompete(t *testing.T) {
	t.Parallel()
	forBothConnections(t, func(t *testing.T, a, b *store.Store) {
		ctx := context.Background()
		insertAged(t, a, "loyalty", "old-", 5, "-31 days")
		var during []error
		res, err := a.Cleanup(ctx, store.RetentionConfig{BatchSize: 2, MinBatchSize: 2, MaxBatchSize: 2, Pause: -1, OnProgress: func(p store.CleanupResult) {
			if p.Batches != 1 {
				return
			}
			_, err := b.Cleanup(ctx, store.RetentionConfig{})
			during = append(during, err)
			_, err = b.DropExpiredPartitions(ctx, store.RetentionConfig{})
			during = append(during, err)
			during = append(during, b.PreparePartitioning(ctx, store.RetentionConfig{}))
		}})
		require.NoError(t, err)
		require.EqualValues(t, 5, res.Deleted)
		require.Len(t, during, 3)
		for _, err := range during {
			require.ErrorIs(t, err, store.ErrNotLeader)
		}
		require.Empty(t, leaseHolder(t, a), "released at the end of the run")

		insertAged(t, a, "loyalty", "older-", 3, "-40 days")
		res, err = b.Cleanup(ctx, store.RetentionConfig{Pause: -1})
		require.NoError(t, err)
		require.EqualValues(t, 3, res.Deleted)
	})
}

// A run whose lease was taken over (it stalled past the lease's time to
// live, and another instance took the lease) deletes nothing more: its
// next batch finds the lease gone, commits nothing and stops with
// ErrNotLeader.
func TestRetentionLeaseFencing(t *testing.T) {
	t.Parallel()
	forBothConnections(t, func(t *testing.T, a, _ *store.Store) {
		ctx := context.Background()
		insertAged(t, a, "loyalty", "old-", 6, "-31 days")
		res, err := a.Cleanup(ctx, store.RetentionConfig{BatchSize: 2, MinBatchSize: 2, MaxBatchSize: 2, Pause: -1, OnProgress: func(p store.CleanupResult) {
			if p.Batches == 1 {
				takeOverLease(t, a)
			}
		}})
		require.ErrorIs(t, err, store.ErrNotLeader)
		require.EqualValues(t, 2, res.Deleted, "the batch after the take-over deleted nothing")
		require.EqualValues(t, 4, countIn(t, a, claimsTable(a), "true"))
		require.Equal(t, "another instance", leaseHolder(t, a), "the release leaves the new holder's lease alone")
	})
}

// The poison memos' batches, transactions of their own after the claims',
// are fenced the same way: taken over after the last claim batch, the run
// deletes no memo.
func TestRetentionLeaseFencesMemoBatches(t *testing.T) {
	t.Parallel()
	forBothConnections(t, func(t *testing.T, a, _ *store.Store) {
		ctx := context.Background()
		insertAged(t, a, "loyalty", "old-", 2, "-31 days")
		insertMemos(t, a, "loyalty", "memo-", 3, "-31 days")
		res, err := a.Cleanup(ctx, store.RetentionConfig{Pause: -1, OnProgress: func(p store.CleanupResult) {
			if p.Batches > 0 && p.BatchRows == 0 { // the claims are done
				takeOverLease(t, a)
			}
		}})
		require.ErrorIs(t, err, store.ErrNotLeader)
		require.EqualValues(t, 2, res.Deleted)
		require.EqualValues(t, 3, memoCount(t, a), "no memo deleted after the take-over")
	})
}

// The heartbeat keeps a lease alive across a step longer than its time to
// live (a long CREATE INDEX CONCURRENTLY, here a long pause between
// batches): another instance still finds it taken.
func TestRetentionLeaseHeartbeat(t *testing.T) {
	t.Parallel()
	a, b := leaseStores(t, false)
	const ttl = 600 * time.Millisecond
	a.SetLeaseTTLForTest(ttl)
	ctx := context.Background()
	insertAged(t, a, "loyalty", "old-", 4, "-31 days")
	var during error
	res, err := a.Cleanup(ctx, store.RetentionConfig{BatchSize: 2, MinBatchSize: 2, MaxBatchSize: 2, Pause: -1, OnProgress: func(p store.CleanupResult) {
		if p.Batches == 1 {
			// Not synchronisation: the long step whose length is the point.
			time.Sleep(3 * ttl)
			_, during = b.Cleanup(ctx, store.RetentionConfig{})
		}
	}})
	require.NoError(t, err)
	require.EqualValues(t, 4, res.Deleted)
	require.ErrorIs(t, during, store.ErrNotLeader)
}

// Environment of TestRetentionLeaseChild.
const (
	envLeaseChildURL    = "CLAIMTX_TEST_LEASE_CHILD_URL"
	envLeaseChildSchema = "CLAIMTX_TEST_LEASE_CHILD_SCHEMA"
	leaseChildHolding   = "lease-child: holding"
)

// A process killed mid-run (SIGKILL: no release) leaves its lease behind;
// the other instances get ErrNotLeader until it expires, one time to live
// after its last renewal, and then lead.
func TestRetentionLeaseOfKilledHolderExpires(t *testing.T) {
	t.Parallel()
	a, _ := leaseStores(t, false)
	const ttl = 2 * time.Second
	a.SetLeaseTTLForTest(ttl)
	insertAged(t, a, "loyalty", "old-", 4, "-31 days")

	cmd := exec.Command(os.Args[0], "-test.run=^TestRetentionLeaseChild$", "-test.count=1") //nolint:gosec // the test binary itself
	cmd.Env = append(os.Environ(), envLeaseChildURL+"="+testenv.DirectURL(), envLeaseChildSchema+"="+a.Config().Schema)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = cmd.Stdout
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(out)
	holding := false
	for !holding && lines.Scan() {
		holding = strings.Contains(lines.Text(), leaseChildHolding)
	}
	require.True(t, holding, "the child never took the lease")
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	killed := time.Now()

	ctx := context.Background()
	_, err = a.Cleanup(ctx, store.RetentionConfig{})
	require.ErrorIs(t, err, store.ErrNotLeader, "the dead holder's lease has not expired yet")
	var res store.CleanupResult
	require.Eventually(t, func() bool {
		res, err = a.Cleanup(ctx, store.RetentionConfig{Pause: -1})
		return err == nil
	}, 5*ttl, 50*time.Millisecond, "last error: %v", err)
	waited := time.Since(killed)
	require.EqualValues(t, 2, res.Deleted, "the child deleted one batch of two before it was killed")
	require.Greater(t, waited, ttl/2, "the lease outlived its holder")
	t.Logf("lease of the killed holder taken over %s after the kill (ttl %s)", waited.Round(time.Millisecond), ttl)
}

// TestRetentionLeaseChild is the child of
// TestRetentionLeaseOfKilledHolderExpires: it deletes one batch and holds
// the lease until killed.
func TestRetentionLeaseChild(t *testing.T) {
	st := childStore(t, envLeaseChildURL, "TestRetentionLeaseOfKilledHolderExpires", store.Config{Schema: os.Getenv(envLeaseChildSchema)})
	st.SetLeaseTTLForTest(2 * time.Second)
	_, err := st.Cleanup(context.Background(), store.RetentionConfig{BatchSize: 2, MinBatchSize: 2, MaxBatchSize: 2, Pause: -1, OnProgress: func(p store.CleanupResult) {
		if p.Batches == 1 {
			_, _ = os.Stdout.WriteString(leaseChildHolding + "\n")
			select {} // until killed
		}
	}})
	t.Fatalf("the child's cleanup returned: %v", err)
}
