package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/timing"
)

// Defaults for RetentionConfig and PartitionConfig fields left zero.
const (
	// DefaultRetention keeps claims 30 days: redeliveries arrive within
	// minutes, dead-letter triage and replays within days to a couple of
	// weeks (see docs/operations.md for choosing it).
	DefaultRetention = 30 * 24 * time.Hour
	// DefaultMinRetention refuses windows under 7 days unless forced: a
	// shorter window re-opens the door to duplicates from ordinary
	// dead-letter replays.
	DefaultMinRetention        = 7 * 24 * time.Hour
	DefaultBatchSize           = 5000
	DefaultMinBatchSize        = 500
	DefaultMaxBatchSize        = 50000
	DefaultTargetBatchDuration = 250 * time.Millisecond
	DefaultBatchPause          = 100 * time.Millisecond
	DefaultBatchTimeout        = time.Minute
)

// Errors of the retention API, matched with errors.Is.
var (
	// ErrNotLeader is returned when another process (any instance, any
	// host) already runs retention work on the same claim table. It is not
	// a failure: exactly one cleaner at a time is the point.
	ErrNotLeader = errors.New("claimtx: not leader: another process holds the retention lock for this claim table")
	// ErrPartitioned is returned by Cleanup on a partitioned claim table,
	// whose retention drops whole days (DropExpiredPartitions) instead of
	// deleting rows.
	ErrPartitioned = errors.New("claimtx: the claim table is partitioned: retention drops whole partitions (DropExpiredPartitions), not rows")
	// ErrNoClaimTable is returned when the claim table does not exist yet:
	// run Migrate first.
	ErrNoClaimTable = errors.New("claimtx: the claim table does not exist (run Migrate first)")
)

// RetentionConfig configures Cleanup. Build it as a literal; zero fields
// take their defaults.
type RetentionConfig struct {
	// Window is how long a claim is kept after it was processed. A
	// duplicate arriving later than this after the original is applied
	// again, so it must exceed every redelivery and replay delay you
	// tolerate; pair it with middleware.ExpiryGuard using the same window.
	// Defaults to 30 days.
	Window time.Duration
	// MinWindow is the smallest Window accepted without Force, a guard
	// against a typo ("30h" for "30d") silently deleting a month of
	// claims. Defaults to 7 days.
	MinWindow time.Duration
	// Force accepts a Window below MinWindow. Sharp edge: every claim older
	// than the window is deleted, and duplicates of those messages will be
	// applied again. Defaults to false.
	Force bool
	// BatchSize is the number of rows the first batch deletes. Later
	// batches adapt toward TargetBatchDuration within
	// [MinBatchSize, MaxBatchSize]; set all three equal for a fixed size.
	// Defaults to 5000.
	BatchSize int
	// MinBatchSize bounds adaptive sizing from below. Defaults to 500.
	MinBatchSize int
	// MaxBatchSize bounds adaptive sizing from above: a batch holds its
	// row locks and WAL until it commits. Defaults to 50000.
	MaxBatchSize int
	// TargetBatchDuration is how long one batch should take. Short batches
	// keep locks, WAL bursts and replication lag small; the batch size is
	// scaled after each batch so its duration approaches this target.
	// Defaults to 250ms.
	TargetBatchDuration time.Duration
	// Pause is the wait between batches, leaving the disk and WAL to the
	// hot path. Negative means no pause. Defaults to 100ms.
	Pause time.Duration
	// BatchTimeout bounds one batch statement (statement_timeout), so a
	// pathological plan cannot hold locks for long. Defaults to 1 minute.
	BatchTimeout time.Duration
	// DryRun counts the rows that would be deleted and deletes nothing. It
	// takes no lock. Defaults to false.
	DryRun bool
	// Vacuum runs VACUUM (ANALYZE) on the claim table after a run that
	// deleted rows, for servers where autovacuum is off or too slow to
	// keep up. Defaults to false (leave it to autovacuum).
	Vacuum bool
	// OnProgress, when set, is called on the cleaning goroutine once
	// before the first batch (Batch 0) and after every batch.
	OnProgress func(CleanupProgress)
}

// CleanupProgress reports a running Cleanup.
type CleanupProgress struct {
	// Batch counts finished batches (0 before the first).
	Batch int
	// Deleted is the number of rows deleted so far in this run.
	Deleted int64
	// Estimated is the planner's estimate, taken at the start, of the rows
	// older than the horizon: good for a progress bar, not for accounting.
	Estimated int64
	// BatchRows and BatchDuration describe the last batch.
	BatchRows     int64
	BatchDuration time.Duration
	// NextBatchSize is the size the next batch will ask for.
	NextBatchSize int
	// Elapsed is the time since Cleanup started.
	Elapsed time.Duration
	// Horizon is the cut-off: claims processed before it are deleted.
	Horizon time.Time
}

// CleanupResult summarises a Cleanup run, complete or interrupted.
type CleanupResult struct {
	// Horizon is the cut-off used (database clock): processed_at < Horizon
	// was deleted, everything else was not touched.
	Horizon time.Time
	// Deleted is the number of claims deleted.
	Deleted int64
	// Batches is the number of delete statements run.
	Batches int
	// DryRun is true when nothing was deleted on purpose; WouldDelete and
	// Oldest are only set then.
	DryRun      bool
	WouldDelete int64
	Oldest      time.Time
	// Duration is the wall time of the run.
	Duration time.Duration
	// Vacuumed is true when VACUUM (ANALYZE) ran after the deletes.
	Vacuumed bool
}

func (c RetentionConfig) withDefaults() RetentionConfig {
	if c.Window == 0 {
		c.Window = DefaultRetention
	}
	if c.MinWindow == 0 {
		c.MinWindow = DefaultMinRetention
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MinBatchSize == 0 {
		c.MinBatchSize = min(DefaultMinBatchSize, c.BatchSize)
	}
	if c.MaxBatchSize == 0 {
		c.MaxBatchSize = max(DefaultMaxBatchSize, c.BatchSize)
	}
	if c.TargetBatchDuration == 0 {
		c.TargetBatchDuration = DefaultTargetBatchDuration
	}
	if c.Pause == 0 {
		c.Pause = DefaultBatchPause
	}
	if c.BatchTimeout == 0 {
		c.BatchTimeout = DefaultBatchTimeout
	}
	return c
}

// Validate reports the first invalid field as a *framework.ConfigError.
func (c RetentionConfig) Validate() error {
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"Window", c.Window}, {"MinWindow", c.MinWindow}, {"TargetBatchDuration", c.TargetBatchDuration}, {"BatchTimeout", c.BatchTimeout}} {
		if f.v < 0 {
			return &framework.ConfigError{Field: f.name, Reason: "must not be negative"}
		}
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"BatchSize", c.BatchSize}, {"MinBatchSize", c.MinBatchSize}, {"MaxBatchSize", c.MaxBatchSize}} {
		if f.v < 0 {
			return &framework.ConfigError{Field: f.name, Reason: "must not be negative"}
		}
	}
	c = c.withDefaults()
	if err := checkWindow("Window", c.Window, c.MinWindow, c.Force); err != nil {
		return err
	}
	switch {
	case c.MinBatchSize > c.MaxBatchSize:
		return &framework.ConfigError{Field: "MinBatchSize", Reason: fmt.Sprintf("%d is above MaxBatchSize %d", c.MinBatchSize, c.MaxBatchSize)}
	case c.BatchSize < c.MinBatchSize || c.BatchSize > c.MaxBatchSize:
		return &framework.ConfigError{Field: "BatchSize", Reason: fmt.Sprintf("%d is outside [MinBatchSize %d, MaxBatchSize %d]", c.BatchSize, c.MinBatchSize, c.MaxBatchSize)}
	}
	return nil
}

// checkWindow refuses retention windows below the minimum unless forced.
func checkWindow(field string, window, minimum time.Duration, force bool) error {
	if window < minimum && !force {
		return &framework.ConfigError{Field: field, Reason: fmt.Sprintf(
			"%s is below the minimum of %s: claims younger than a replay can arrive would be deleted and those duplicates applied again (force it if you mean it)",
			window, minimum)}
	}
	return nil
}

// Cleanup deletes claims processed before now minus cfg.Window, in small
// batches, until none are left. Why it is shaped like this:
//
//   - One leader: a session-level advisory lock, taken with a try-lock on a
//     dedicated connection, makes every other concurrent Cleanup (on any
//     instance) return ErrNotLeader at once instead of competing for the
//     same rows and deadlocking.
//   - Small batches, each its own transaction: a batch selects the oldest
//     ctids below the horizon through the processed_at index (resuming
//     where the previous batch stopped, so dead index entries are not
//     rescanned), deletes exactly those, and commits. Locks, WAL bursts and
//     replication lag stay small, and an interruption loses at most one
//     batch. The batch size adapts toward TargetBatchDuration.
//   - Never inside the window: both the selection and the delete re-check
//     processed_at < horizon, with the horizon fixed once per run from the
//     database clock (not the application's).
//   - Off the hot path: batches never share a transaction with claims, run
//     with synchronous_commit off (a lost delete is redone next run) and a
//     statement timeout, and pause between each other.
//
// Interrupt it by cancelling ctx; the result then reports what was done and
// the error wraps ctx's. Run it again to resume: it simply continues with
// what is left. Cleanup refuses a partitioned table (ErrPartitioned).
func (s *Store) Cleanup(ctx context.Context, cfg RetentionConfig) (CleanupResult, error) {
	if err := cfg.Validate(); err != nil {
		return CleanupResult{}, err
	}
	cfg = cfg.withDefaults()
	start := time.Now()
	res := CleanupResult{DryRun: cfg.DryRun}

	kind, err := s.claimTableKind(ctx, s.pool)
	if err != nil {
		return res, err
	}
	if kind == "p" {
		return res, ErrPartitioned
	}
	if err := s.pool.QueryRow(ctx, "SELECT now() - $1 * interval '1 microsecond'", cfg.Window.Microseconds()).Scan(&res.Horizon); err != nil {
		return res, fmt.Errorf("claimtx: cleanup horizon: %w", err)
	}

	if cfg.DryRun {
		var oldest pgtype.Timestamptz
		err := s.pool.QueryRow(ctx, s.render("SELECT count(*), min(processed_at) FROM {schema}.{claims} WHERE processed_at < $1"), res.Horizon).Scan(&res.WouldDelete, &oldest)
		if err != nil {
			return res, fmt.Errorf("claimtx: cleanup dry run: %w", err)
		}
		res.Oldest = oldest.Time
		res.Duration = time.Since(start)
		return res, nil
	}

	conn, release, err := s.lockRetention(ctx)
	if err != nil {
		return res, err
	}
	defer release()

	estimated, err := s.estimateBelow(ctx, conn, res.Horizon)
	if err != nil {
		return res, err
	}
	progress := CleanupProgress{Estimated: estimated, NextBatchSize: cfg.BatchSize, Horizon: res.Horizon}
	report := func() {
		if cfg.OnProgress != nil {
			progress.Elapsed = time.Since(start)
			cfg.OnProgress(progress)
		}
	}
	report()

	deleteSQL := s.render(`WITH batch AS (
    SELECT ctid FROM {schema}.{claims}
    WHERE processed_at >= $1 AND processed_at < $2
    ORDER BY processed_at
    LIMIT $3
), deleted AS (
    DELETE FROM {schema}.{claims}
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM batch)) AND processed_at < $2
    RETURNING processed_at
)
SELECT count(*), max(processed_at) FROM deleted`)
	timeout := strconv.FormatInt(max(cfg.BatchTimeout.Milliseconds(), 1), 10) + "ms"
	// The first batch starts below every real timestamp; each later batch
	// starts at the newest processed_at the previous one deleted, so the
	// index scan skips the dead entries of earlier batches instead of
	// wading through them again. ">=" keeps rows sharing that timestamp;
	// the ones already deleted are simply not visible any more.
	from := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	size := cfg.BatchSize
	for {
		if err := ctx.Err(); err != nil {
			res.Duration = time.Since(start)
			return res, fmt.Errorf("claimtx: cleanup interrupted after %d claims: %w", res.Deleted, err)
		}
		var n int64
		var last pgtype.Timestamptz
		b := &pgx.Batch{}
		// One implicit transaction per batch (a pipeline with one Sync), so
		// these settings are local to it and never leak into the pool.
		b.Queue("SELECT set_config('statement_timeout', $1, true), set_config('synchronous_commit', 'off', true)", timeout)
		b.Queue(deleteSQL, from, res.Horizon, size).QueryRow(func(row pgx.Row) error { return row.Scan(&n, &last) })
		batchStart := time.Now()
		err := conn.SendBatch(ctx, b).Close()
		took := time.Since(batchStart)
		if err != nil {
			res.Duration = time.Since(start)
			if ctx.Err() != nil {
				return res, fmt.Errorf("claimtx: cleanup interrupted after %d claims: %w", res.Deleted, ctx.Err())
			}
			return res, fmt.Errorf("claimtx: cleanup batch %d: %w", res.Batches+1, err)
		}
		res.Batches++
		res.Deleted += n
		if last.Valid {
			from = last
		}
		asked := size
		if n == int64(asked) {
			size = nextBatchSize(size, took, cfg)
		}
		progress.Batch, progress.Deleted, progress.BatchRows, progress.BatchDuration, progress.NextBatchSize = res.Batches, res.Deleted, n, took, size
		report()
		if n == 0 {
			break
		}
		if n == int64(asked) && cfg.Pause > 0 {
			if err := timing.Sleep(ctx, cfg.Pause); err != nil {
				res.Duration = time.Since(start)
				return res, fmt.Errorf("claimtx: cleanup interrupted after %d claims: %w", res.Deleted, err)
			}
		}
	}
	if cfg.Vacuum && res.Deleted > 0 {
		if _, err := conn.Exec(ctx, s.render("VACUUM (ANALYZE) {schema}.{claims}")); err != nil {
			res.Duration = time.Since(start)
			return res, fmt.Errorf("claimtx: vacuum after cleanup: %w", err)
		}
		res.Vacuumed = true
	}
	res.Duration = time.Since(start)
	return res, nil
}

// nextBatchSize scales size so the next batch takes about the target,
// changing it at most twofold per step: one slow batch (a checkpoint, a
// cold cache) should not collapse the size, nor one fast batch explode it.
func nextBatchSize(size int, took time.Duration, cfg RetentionConfig) int {
	took = max(took, time.Millisecond)
	ideal := float64(size) * float64(cfg.TargetBatchDuration) / float64(took)
	ideal = min(max(ideal, float64(size)/2), float64(size)*2)
	return min(max(int(ideal), cfg.MinBatchSize), cfg.MaxBatchSize)
}

// estimateBelow asks the planner how many claims are older than horizon:
// instant, where an exact count would scan millions of index entries.
func (s *Store) estimateBelow(ctx context.Context, conn *pgxpool.Conn, horizon time.Time) (int64, error) {
	var plan []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	var text string
	if err := conn.QueryRow(ctx, s.render("EXPLAIN (FORMAT JSON) SELECT 1 FROM {schema}.{claims} WHERE processed_at < $1"), horizon).Scan(&text); err != nil {
		return 0, fmt.Errorf("claimtx: estimate expired claims: %w", err)
	}
	if err := json.Unmarshal([]byte(text), &plan); err != nil {
		return 0, fmt.Errorf("claimtx: estimate expired claims: %w", err)
	}
	if len(plan) == 0 {
		return 0, nil
	}
	return int64(plan[0].Plan.Rows), nil
}

// retentionLockKey identifies the retention leader of one claim table.
// Cleanup, partition maintenance and the partitioning conversion share it,
// so at most one of them runs against a table at any time.
func (s *Store) retentionLockKey() int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("claimtx:retention:" + s.cfg.Schema + "." + s.cfg.ClaimsTable)) // hash writes never fail
	return int64(h.Sum64())
}

// lockRetention takes the retention leader lock on a dedicated connection
// with a try-lock (never queueing behind another leader) and returns the
// connection and a release function that unlocks and returns it. The lock
// is session-level, so it spans the many short transactions of a run; if
// the process dies, the server drops it with the session.
func (s *Store) lockRetention(ctx context.Context) (*pgxpool.Conn, func(), error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("claimtx: retention: acquire connection: %w", err)
	}
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", s.retentionLockKey()).Scan(&locked); err != nil {
		conn.Release()
		return nil, nil, fmt.Errorf("claimtx: retention lock: %w", err)
	}
	if !locked {
		conn.Release()
		return nil, nil, ErrNotLeader
	}
	release := func() {
		if !conn.Conn().IsClosed() {
			// The run's ctx may be cancelled (that is how it was
			// interrupted); unlocking must still happen.
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", s.retentionLockKey()); err != nil {
				// A connection in an unknown state must not go back to
				// the pool still holding the lock: closing it ends the
				// session, and the server releases the lock.
				_ = conn.Conn().Close(uctx)
			}
			cancel()
		}
		conn.Release()
	}
	return conn, release, nil
}

// querier is what pgxpool.Pool, pgxpool.Conn and pgx.Tx have in common.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// claimTableKind returns the claim table's pg_class.relkind: "r" for a
// plain table, "p" for a partitioned one. A missing table is
// ErrNoClaimTable: no caller can do anything with it but refuse.
func (s *Store) claimTableKind(ctx context.Context, q querier) (string, error) {
	var kind string
	err := q.QueryRow(ctx, `SELECT c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`, s.cfg.Schema, s.cfg.ClaimsTable).Scan(&kind)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNoClaimTable
	}
	if err != nil {
		return "", fmt.Errorf("claimtx: inspect claim table: %w", err)
	}
	return kind, nil
}
