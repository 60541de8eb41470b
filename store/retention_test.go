package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// cleanup runs st.Cleanup with cfg, which must succeed.
func cleanup(t *testing.T, st *store.Store, cfg store.RetentionConfig) store.CleanupResult {
	t.Helper()
	res, err := st.Cleanup(context.Background(), cfg)
	require.NoError(t, err)
	return res
}

func TestCleanupBoundaries(t *testing.T) {
	t.Parallel()
	st := migratedWith(t, 4,
		// Outside the 30-day window: just outside, far outside, and 23 rows
		// sharing one timestamp so that ties straddle batch boundaries.
		aged{"loyalty", "just-out-", 5, "-30 days -1 second"},
		aged{"loyalty", "tie-", 23, "-45 days"},
		aged{"analytics", "far-out-", 9, "-400 days"},
		// Inside: just inside, and recent.
		aged{"loyalty", "just-in-", 6, "-30 days +1 minute"},
		aged{"loyalty", "recent-", 4, "-1 second"},
	)

	var seen []store.CleanupResult
	cfg := fixedBatches(7)
	cfg.OnProgress = func(p store.CleanupResult) { seen = append(seen, p) }
	res := cleanup(t, st, cfg)
	require.EqualValues(t, 37, res.Deleted)
	require.GreaterOrEqual(t, res.Batches, 6, "37 rows in batches of 7, then an empty batch")
	require.EqualValues(t, 0, countWhere(t, st, "message_key LIKE 'just-out-%' OR message_key LIKE 'tie-%' OR message_key LIKE 'far-out-%'"))
	require.EqualValues(t, 10, countWhere(t, st, "true"), "claims inside the window are never touched")
	require.EqualValues(t, 6, countWhere(t, st, "message_key LIKE 'just-in-%'"))
	require.WithinDuration(t, time.Now().Add(-pg.DefaultRetention), res.Horizon, time.Minute)

	require.NotEmpty(t, seen)
	require.Equal(t, 0, seen[0].Batches)
	require.Equal(t, res.Horizon, seen[0].Horizon)
	last := seen[len(seen)-1]
	require.EqualValues(t, 37, last.Deleted)
	require.Equal(t, res.Batches, last.Batches)
	require.EqualValues(t, 0, last.BatchRows)

	// Nothing left: a second run deletes nothing.
	res = cleanup(t, st, fixedBatches(7))
	require.EqualValues(t, 0, res.Deleted)
	require.Equal(t, 1, res.Batches)
}

func TestCleanupAdaptiveBatchesAndVacuum(t *testing.T) {
	t.Parallel()
	st := migratedWith(t, 2, aged{"c", "old-", 3000, "-60 days"}, aged{"c", "new-", 10, "-1 day"})
	var sizes []int
	res := cleanup(t, st, store.RetentionConfig{
		BatchSize: 100, MinBatchSize: 50, MaxBatchSize: 800,
		TargetBatchDuration: time.Hour, // every batch is "too fast": sizes double up to the cap
		Pause:               -1,
		Vacuum:              true,
		OnProgress:          func(p store.CleanupResult) { sizes = append(sizes, p.NextBatchSize) },
	})
	require.EqualValues(t, 3000, res.Deleted)
	require.True(t, res.Vacuumed)
	require.Equal(t, []int{100, 200, 400, 800, 800, 800}, sizes[:6])
	require.EqualValues(t, 10, countWhere(t, st, "true"))
}

func TestCleanupSettingsDoNotLeak(t *testing.T) {
	t.Parallel()
	st := migratedWith(t, 1, aged{"c", "old-", 20, "-60 days"}) // one connection: the cleaner's is the one we inspect
	ctx := context.Background()
	cleanup(t, st, fixedBatches(5))
	var timeout, syncCommit string
	require.NoError(t, st.Pool().QueryRow(ctx, "SELECT current_setting('statement_timeout'), current_setting('synchronous_commit')").Scan(&timeout, &syncCommit))
	require.Equal(t, "0", timeout)
	require.Equal(t, "on", syncCommit)
	var held int
	require.NoError(t, st.Pool().QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").Scan(&held))
	require.Zero(t, held, "the leader lock is released with the run")
}

func TestCleanupMinimumRetention(t *testing.T) {
	t.Parallel()
	st := migratedWith(t, 2, aged{"c", "two-days-", 3, "-2 days"})
	ctx := context.Background()

	var ce *framework.ConfigError
	_, err := st.Cleanup(ctx, store.RetentionConfig{Retention: 24 * time.Hour})
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "Retention", ce.Field)
	require.Contains(t, ce.Reason, "below the minimum")
	require.EqualValues(t, 3, countWhere(t, st, "true"), "a refused run deletes nothing")

	// A lower minimum, or Force, lets a short retention through.
	res := cleanup(t, st, store.RetentionConfig{Retention: 3 * 24 * time.Hour, MinRetention: 3 * 24 * time.Hour, Pause: -1})
	require.EqualValues(t, 0, res.Deleted)
	res = cleanup(t, st, store.RetentionConfig{Retention: 24 * time.Hour, Force: true, Pause: -1})
	require.EqualValues(t, 3, res.Deleted)

	for _, tc := range []struct {
		field string
		cfg   store.RetentionConfig
	}{
		{"Retention", store.RetentionConfig{Retention: -time.Hour}},
		{"MinRetention", store.RetentionConfig{MinRetention: -time.Hour}},
		{"BatchSize", store.RetentionConfig{BatchSize: -1}},
		{"MinBatchSize", store.RetentionConfig{MinBatchSize: 10, MaxBatchSize: 5, BatchSize: 7}},
		{"BatchSize", store.RetentionConfig{BatchSize: 10, MaxBatchSize: 5, MinBatchSize: 1}},
		{"TargetBatchDuration", store.RetentionConfig{TargetBatchDuration: -1}},
		{"BatchTimeout", store.RetentionConfig{BatchTimeout: -1}},
	} {
		err := tc.cfg.Validate()
		require.ErrorAs(t, err, &ce, "%+v", tc.cfg)
		require.Equal(t, tc.field, ce.Field, "%+v", tc.cfg)
	}
	require.NoError(t, store.RetentionConfig{}.Validate())
	require.NoError(t, store.RetentionConfig{BatchSize: 100000}.Validate(), "a large first batch raises the default cap")
}

func TestCleanupDryRun(t *testing.T) {
	t.Parallel()
	st := migratedWith(t, 2, aged{"c", "old-", 12, "-31 days"}, aged{"c", "older-", 3, "-90 days"}, aged{"c", "new-", 4, "-29 days"})

	res := cleanup(t, st, store.RetentionConfig{DryRun: true})
	require.EqualValues(t, 15, res.WouldDelete)
	require.EqualValues(t, 0, res.Deleted)
	require.WithinDuration(t, time.Now().AddDate(0, 0, -90), res.Oldest, time.Minute)
	require.EqualValues(t, 19, countWhere(t, st, "true"), "a dry run deletes nothing")
}

// Two cleaners at once: the second finds the first holding the leader lock
// and reports ErrNotLeader without touching anything; once the first is
// done the lock is free again.
func TestCleanupLeaderExclusive(t *testing.T) {
	t.Parallel()
	st := migratedWith(t, 4, aged{"c", "old-", 40, "-60 days"})
	ctx := context.Background()

	var secondErr error
	var secondRes store.CleanupResult
	cfg := fixedBatches(10)
	cfg.OnProgress = func(p store.CleanupResult) {
		if p.Batches == 1 { // the first cleaner is mid-run and holds the lock
			secondRes, secondErr = st.Cleanup(ctx, fixedBatches(10))
		}
	}
	res := cleanup(t, st, cfg)
	require.EqualValues(t, 40, res.Deleted, "the leader deleted everything")
	require.ErrorIs(t, secondErr, store.ErrNotLeader)
	require.EqualValues(t, 0, secondRes.Deleted)

	// Another store value on the same table (another instance) is
	// excluded the same way: the lock lives in Postgres.
	other, err := store.New(st.Pool(), st.Config())
	require.NoError(t, err)
	cfg.OnProgress = func(p store.CleanupResult) {
		if p.Batches == 0 {
			_, secondErr = other.Cleanup(ctx, fixedBatches(10))
		}
	}
	cleanup(t, st, cfg)
	require.ErrorIs(t, secondErr, store.ErrNotLeader)

	_, err = other.Cleanup(ctx, fixedBatches(10))
	require.NoError(t, err, "the lock is released when the leader finishes")
}

func TestCleanupInterruptAndResume(t *testing.T) {
	t.Parallel()
	st := migratedWith(t, 4, aged{"c", "old-", 100, "-60 days"}, aged{"c", "new-", 5, "-1 hour"})
	ctx := context.Background()

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg := fixedBatches(10)
	cfg.OnProgress = func(p store.CleanupResult) {
		if p.Batches == 3 {
			cancel() // an operator's Ctrl-C, a deploy, a deadline
		}
	}
	res, err := st.Cleanup(runCtx, cfg)
	require.ErrorIs(t, err, context.Canceled)
	require.EqualValues(t, 30, res.Deleted)
	require.EqualValues(t, 75, countWhere(t, st, "true"))

	// Resume: a new run continues with what is left.
	res = cleanup(t, st, fixedBatches(10))
	require.EqualValues(t, 70, res.Deleted)
	require.EqualValues(t, 5, countWhere(t, st, "true"))
	require.EqualValues(t, 5, countWhere(t, st, "message_key LIKE 'new-%'"))
}

func TestCleanupTableStates(t *testing.T) {
	t.Parallel()
	st := testenv.Store(t, 2)
	ctx := context.Background()
	_, err := st.Cleanup(ctx, store.RetentionConfig{})
	require.ErrorIs(t, err, store.ErrNoClaimTable)
	_, err = st.Stats(ctx)
	require.ErrorIs(t, err, store.ErrNoClaimTable)

	require.NoError(t, st.Migrate(ctx))
	_, err = st.EnablePartitioning(ctx, store.RetentionConfig{})
	require.NoError(t, err)
	_, err = st.Cleanup(ctx, store.RetentionConfig{})
	require.ErrorIs(t, err, store.ErrPartitioned)
}

func TestStats(t *testing.T) {
	t.Parallel()
	st := migratedWith(t, 2, aged{"loyalty", "a-", 30, "-3 days"}, aged{"loyalty", "b-", 20, "-1 hour"}, aged{"analytics", "a-", 7, "-10 days"})
	ctx := context.Background()

	s, err := st.Stats(ctx)
	require.NoError(t, err)
	require.False(t, s.Partitioned)
	require.Zero(t, s.Partitions)
	require.EqualValues(t, 57, s.Claims)
	require.Len(t, s.Consumers, 2)
	require.Equal(t, "analytics", s.Consumers[0].Consumer)
	require.EqualValues(t, 7, s.Consumers[0].Claims)
	require.Equal(t, "loyalty", s.Consumers[1].Consumer)
	require.EqualValues(t, 50, s.Consumers[1].Claims)
	require.WithinDuration(t, time.Now().AddDate(0, 0, -3), s.Consumers[1].Oldest, time.Minute)
	require.WithinDuration(t, time.Now().Add(-time.Hour), s.Consumers[1].Newest, time.Minute)
	require.Positive(t, s.TableBytes)
	require.Positive(t, s.IndexBytes)
	require.Greater(t, s.BytesPerClaim, 0.0)

	// Stats takes no leader lock: operators read it while a cleanup runs.
	var during error
	cleanup(t, st, store.RetentionConfig{Pause: -1, OnProgress: func(store.CleanupResult) { _, during = st.Stats(ctx) }})
	require.NoError(t, during, "Stats must not need the lock a cleanup holds (ErrNotLeader)")
}

// Memos obey the claims' retention: Cleanup deletes those last poisoned
// before its horizon, in batches, after the claims; a dry run counts them.
func TestCleanupRemovesExpiredPoisonMemos(t *testing.T) {
	t.Parallel()
	st := testenv.Migrated(t, 4)
	ctx := context.Background()
	insertMemos(t, st, "loyalty", "old-", 7, "-31 days")
	insertMemos(t, st, "loyalty", "young-", 3, "-29 days")
	insertAged(t, st, "loyalty", "k", 2, "-31 days")

	cfg := fixedBatches(2)
	cfg.DryRun = true
	res := cleanup(t, st, cfg)
	require.EqualValues(t, 7, res.Memos)
	require.EqualValues(t, 10, memoCount(t, st), "a dry run deletes nothing")

	res = cleanup(t, st, fixedBatches(2))
	require.EqualValues(t, 2, res.Deleted)
	require.EqualValues(t, 7, res.Memos)
	require.EqualValues(t, 3, memoCount(t, st))
	require.EqualValues(t, 3, countIn(t, st, memoTable(st), "message_key LIKE 'young-%'"))

	// A schema without the memo table (as before migration 4) cleans
	// claims as before.
	_, err := st.Pool().Exec(ctx, "DROP TABLE "+memoTable(st))
	require.NoError(t, err)
	insertAged(t, st, "loyalty", "k", 1, "-31 days")
	res = cleanup(t, st, fixedBatches(2))
	require.EqualValues(t, 1, res.Deleted)
	require.Zero(t, res.Memos)
}
