package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
)

// Errors of the retention API, matched with errors.Is.
var (
	// ErrNotLeader is returned when another process already runs retention
	// work on the same claim table: not a failure, one cleaner at a time is
	// the point. The leader's lease (a row of <schema>.claimtx_lease)
	// expires 30 s after its last renewal; a run whose lease was taken over
	// meanwhile stops with ErrNotLeader too, committing nothing more.
	ErrNotLeader = errors.New("claimtx: not leader: another process holds the retention lease for this claim table")
	// ErrPartitioned is returned by Cleanup on a partitioned claim table,
	// whose retention drops whole days (DropExpiredPartitions) instead of
	// deleting rows.
	ErrPartitioned = errors.New("claimtx: the claim table is partitioned: retention drops whole partitions (DropExpiredPartitions), not rows")
	// ErrNoClaimTable is returned when the claim table does not exist yet:
	// run Migrate first.
	ErrNoClaimTable = errors.New("claimtx: the claim table does not exist (run Migrate first)")
)

// RetentionConfig says how long claims are kept and how Cleanup (plain
// table) or the partition methods (partitioned table) get rid of older
// ones. Zero fields take their defaults. Use one value for every call, and
// the same Retention for middleware.ExpiryGuard.
type RetentionConfig struct {
	// Retention is how long a claim is kept. A duplicate arriving later
	// than this after the original is applied again (plain table) or
	// refused as expired (partitioned table), so it must exceed every
	// redelivery and replay delay you tolerate. Cleanup measures it from
	// the processing time, partitioned mode from the event time (and needs
	// at least a day). Defaults to 30 days.
	Retention time.Duration
	// MinRetention is the smallest Retention accepted without Force, a
	// guard against a typo ("30h" for "30d") silently deleting a month of
	// claims. Defaults to 7 days.
	MinRetention time.Duration
	// Force accepts a Retention below MinRetention. Sharp edge: duplicates
	// of the messages whose claims go are applied again (or, partitioned,
	// refused as expired). Defaults to false.
	Force bool
	// DryRun deletes, creates and drops nothing, only counts or lists
	// (Cleanup then takes no lock). Defaults to false.
	DryRun bool

	// BatchSize is the size of Cleanup's first batch; later ones adapt
	// toward TargetBatchDuration (all three equal: fixed). Defaults to 5000.
	BatchSize int
	// MinBatchSize and MaxBatchSize bound adaptive sizing (a batch holds
	// its row locks and WAL until it commits). They default to 500 and
	// 50000, or BatchSize if that is beyond.
	MinBatchSize, MaxBatchSize int
	// TargetBatchDuration is how long one batch should take: short batches
	// keep locks, WAL bursts and replication lag small. Defaults to 250ms.
	TargetBatchDuration time.Duration
	// Pause is the wait between batches, leaving the disk and WAL to the
	// hot path. Negative means no pause. Defaults to 100ms.
	Pause time.Duration
	// BatchTimeout bounds one batch statement (statement_timeout).
	// Defaults to 1 minute.
	BatchTimeout time.Duration
	// Vacuum runs VACUUM (ANALYZE) on the claim table after a Cleanup that
	// deleted rows, where autovacuum does not keep up. Defaults to false.
	Vacuum bool
	// OnProgress, when set, is called on the cleaning goroutine with the
	// result so far, before Cleanup's first batch and after every batch.
	OnProgress func(CleanupResult)

	// Ahead is how many days after today (UTC) get a partition: run
	// maintenance at least every Ahead days. At most 366. Defaults to 7.
	Ahead int
	// LockWait bounds each wait of partition DDL for a lock that blocks
	// claims while queued: past it the DDL gives up and retries instead of
	// stalling every consumer behind a long transaction. Defaults to 2s.
	LockWait time.Duration
	// LockTries is how many times such DDL is attempted. Defaults to 5.
	LockTries int
}

// CleanupResult summarises a Cleanup run, complete or interrupted, or
// (RetentionConfig.OnProgress) a running one so far.
type CleanupResult struct {
	// Horizon is the cut-off used (database clock): processed_at < Horizon
	// was deleted, everything else was not touched.
	Horizon time.Time
	Deleted int64 // claims deleted
	Batches int   // delete statements run
	// WouldDelete and Oldest are set by a DryRun only: the number of
	// claims processed before Horizon, and the oldest processed_at among
	// them (zero when none).
	WouldDelete int64
	Oldest      time.Time
	Duration    time.Duration // wall time of the run (so far)
	// BatchRows and BatchDuration describe the last batch, NextBatchSize
	// the size the next batch will ask for.
	BatchRows     int64
	BatchDuration time.Duration
	NextBatchSize int
	Vacuumed      bool // VACUUM (ANALYZE) ran after the deletes
	// Memos is the number of poison memos (middleware.Claim.PoisonMemo)
	// last poisoned before Horizon deleted after the claims (a DryRun
	// counts them); 0 when the role may not delete them.
	Memos int64
}

func (c RetentionConfig) withDefaults() RetentionConfig {
	c.Retention = cmp.Or(c.Retention, pg.DefaultRetention)
	c.MinRetention = cmp.Or(c.MinRetention, pg.DefaultMinRetention)
	c.BatchSize = cmp.Or(c.BatchSize, pg.DefaultBatchSize)
	c.MinBatchSize = cmp.Or(c.MinBatchSize, min(pg.DefaultMinBatchSize, c.BatchSize))
	c.MaxBatchSize = cmp.Or(c.MaxBatchSize, max(pg.DefaultMaxBatchSize, c.BatchSize))
	c.TargetBatchDuration = cmp.Or(c.TargetBatchDuration, pg.DefaultTargetBatchDuration)
	c.Pause = cmp.Or(c.Pause, pg.DefaultBatchPause)
	c.BatchTimeout = cmp.Or(c.BatchTimeout, pg.DefaultBatchTimeout)
	c.Ahead = cmp.Or(c.Ahead, pg.DefaultPartitionsAhead)
	c.LockWait = cmp.Or(c.LockWait, pg.DefaultPartitionLockWait)
	c.LockTries = cmp.Or(c.LockTries, pg.DefaultPartitionLockTries)
	return c
}

// Validate reports the first invalid field as a *framework.ConfigError,
// for checking a configuration before there is a Store to call (Cleanup
// and the partition methods validate theirs).
func (c RetentionConfig) Validate() error {
	for _, f := range []struct {
		name     string
		negative bool
	}{
		{"Retention", c.Retention < 0}, {"MinRetention", c.MinRetention < 0}, {"TargetBatchDuration", c.TargetBatchDuration < 0},
		{"BatchTimeout", c.BatchTimeout < 0}, {"LockWait", c.LockWait < 0}, {"BatchSize", c.BatchSize < 0},
		{"MinBatchSize", c.MinBatchSize < 0}, {"MaxBatchSize", c.MaxBatchSize < 0}, {"LockTries", c.LockTries < 0},
	} {
		if f.negative {
			return &framework.ConfigError{Field: f.name, Reason: "must not be negative"}
		}
	}
	if c.Ahead < 0 || c.Ahead > maxPartitionsAhead {
		return &framework.ConfigError{Field: "Ahead", Reason: fmt.Sprintf("%d is outside 0..%d days", c.Ahead, maxPartitionsAhead)}
	}
	c = c.withDefaults()
	if c.Retention < c.MinRetention && !c.Force {
		return &framework.ConfigError{Field: "Retention", Reason: fmt.Sprintf(
			"%s is below the minimum of %s: claims younger than a replay can arrive would be deleted and those duplicates applied again (force it if you mean it)",
			c.Retention, c.MinRetention)}
	}
	switch {
	case c.MinBatchSize > c.MaxBatchSize:
		return &framework.ConfigError{Field: "MinBatchSize", Reason: fmt.Sprintf("%d is above MaxBatchSize %d", c.MinBatchSize, c.MaxBatchSize)}
	case c.BatchSize < c.MinBatchSize || c.BatchSize > c.MaxBatchSize:
		return &framework.ConfigError{Field: "BatchSize", Reason: fmt.Sprintf("%d is outside [MinBatchSize %d, MaxBatchSize %d]", c.BatchSize, c.MinBatchSize, c.MaxBatchSize)}
	}
	return nil
}

// validatePartitioned is Validate for the partition methods, whose
// retention drops whole days: one shorter than a day cannot be honoured.
func (c RetentionConfig) validatePartitioned() error {
	if err := c.Validate(); err != nil {
		return err
	}
	if r := c.withDefaults().Retention; r < 24*time.Hour {
		return &framework.ConfigError{Field: "Retention", Reason: fmt.Sprintf("%s is shorter than one day, the partition granularity", r)}
	}
	return nil
}

// Cleanup deletes claims processed before now minus cfg.Retention
// (database clock) in small batches, then the poison memos last poisoned
// before that horizon. One leader at a time: a lease row renewed by every
// batch makes other runs return ErrNotLeader, also behind a transaction
// pooler. Cancel ctx to interrupt it (the result says what was done, the
// error wraps ctx's) and run it again to resume. A partitioned table is
// refused (ErrPartitioned). docs/operations.md ("Batched cleanup") has the
// details.
func (s *Store) Cleanup(ctx context.Context, cfg RetentionConfig) (res CleanupResult, err error) {
	if err := cfg.Validate(); err != nil {
		return CleanupResult{}, err
	}
	cfg = cfg.withDefaults()
	start := time.Now()

	kind, err := s.claimTableKind(ctx, s.pool)
	if err != nil {
		return res, err
	}
	if kind == "p" {
		return res, ErrPartitioned
	}
	if res.Horizon, err = s.horizon(ctx, s.pool, cfg.Retention); err != nil {
		return res, err
	}

	if cfg.DryRun {
		var oldest pgtype.Timestamptz
		err := s.pool.QueryRow(ctx, s.names.Render("SELECT count(*), min(processed_at) FROM {schema}.{claims} WHERE processed_at < $1"), res.Horizon).Scan(&res.WouldDelete, &oldest)
		if err != nil {
			return res, fmt.Errorf("claimtx: cleanup dry run: %w", err)
		}
		res.Oldest = oldest.Time
		if res.Memos, err = s.cleanupMemos(ctx, s.pool, res.Horizon, cfg); err == nil {
			res.Duration = time.Since(start)
		}
		return res, err
	}

	ctx, conn, l, err := s.lockRetention(ctx)
	if err != nil {
		return res, err
	}
	defer l.release(&err)
	// Interrupted or not, the result says how long the run took.
	defer func() { res.Duration = time.Since(start) }()

	res.NextBatchSize = cfg.BatchSize
	report := func() {
		if cfg.OnProgress != nil {
			res.Duration = time.Since(start)
			cfg.OnProgress(res)
		}
	}
	report()
	interrupted := func(err error) error {
		return fmt.Errorf("claimtx: cleanup interrupted after %d claims: %w", res.Deleted, err)
	}

	// The batch renews the lease in its own statement and deletes nothing
	// unless the lease still is this run's (see renewSQL).
	deleteSQL := s.names.Render(`WITH lease AS (
    UPDATE {schema}.claimtx_lease SET expires_at = now() + $6 * interval '1 microsecond'
    WHERE name = $4 AND holder = $5 RETURNING true
), batch AS (
    SELECT ctid FROM {schema}.{claims}
    WHERE processed_at >= $1 AND processed_at < $2 AND EXISTS (SELECT FROM lease)
    ORDER BY processed_at
    LIMIT $3
), deleted AS (
    DELETE FROM {schema}.{claims}
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM batch)) AND processed_at < $2
    RETURNING processed_at
)
SELECT EXISTS (SELECT FROM lease), count(*), max(processed_at) FROM deleted`)
	timeout := pg.Millis(cfg.BatchTimeout)
	// Each batch starts at the newest processed_at the previous one
	// deleted, so the index scan skips the dead entries of earlier batches.
	// ">=" keeps rows sharing that timestamp; deleted ones are invisible.
	from := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	size := cfg.BatchSize
	for {
		if err := ctx.Err(); err != nil {
			return res, interrupted(err)
		}
		var leased bool
		var n int64
		var last pgtype.Timestamptz
		b := &pgx.Batch{}
		// One implicit transaction per batch (a pipeline with one Sync), so
		// these settings are local to it and never leak into the pool.
		b.Queue(batchSettings, timeout)
		b.Queue(deleteSQL, from, res.Horizon, size, l.name, l.holder, l.ttl.Microseconds()).QueryRow(func(row pgx.Row) error { return row.Scan(&leased, &n, &last) })
		batchStart := time.Now()
		err := conn.SendBatch(ctx, b).Close()
		took := time.Since(batchStart)
		if err != nil {
			if ctx.Err() != nil {
				return res, interrupted(ctx.Err())
			}
			return res, fmt.Errorf("claimtx: cleanup batch %d: %w", res.Batches+1, err)
		}
		if !leased {
			l.lost()
			return res, fmt.Errorf("claimtx: cleanup stopped after %d claims: %w", res.Deleted, ErrNotLeader)
		}
		res.Batches++
		res.Deleted += n
		if last.Valid {
			from = last
		}
		full := n == int64(size)
		if full {
			size = nextBatchSize(size, took, cfg)
		}
		res.BatchRows, res.BatchDuration, res.NextBatchSize = n, took, size
		report()
		if n == 0 {
			break
		}
		if full && cfg.Pause > 0 {
			if err := pg.Sleep(ctx, cfg.Pause); err != nil {
				return res, interrupted(err)
			}
		}
	}
	if res.Memos, err = s.cleanupMemos(ctx, conn, res.Horizon, cfg); err != nil {
		return res, err
	}
	if cfg.Vacuum && res.Deleted > 0 {
		if err := execRenewed(ctx, conn, s.names.Render("VACUUM (ANALYZE) {schema}.{claims}"), "vacuum after cleanup"); err != nil {
			return res, err
		}
		res.Vacuumed = true
	}
	return res, nil
}

// batchSettings sets a retention batch's statement timeout and turns
// synchronous_commit off: a lost delete is redone next run.
const batchSettings = "SELECT set_config('statement_timeout', $1, true), set_config('synchronous_commit', 'off', true)"

// horizon is now minus retention on the database clock.
func (s *Store) horizon(ctx context.Context, q pg.Querier, retention time.Duration) (time.Time, error) {
	var h time.Time
	err := q.QueryRow(ctx, "SELECT now() - $1 * interval '1 microsecond'", retention.Microseconds()).Scan(&h)
	return h, pg.Wrap(err, "claimtx: retention horizon")
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

// lockRetention takes the retention lease and a connection for the run.
// The returned context carries the lease (leaseOf) and is cancelled with
// cause ErrNotLeader when it is lost. End the run with l.release(&err),
// which also returns the connection.
func (s *Store) lockRetention(ctx context.Context) (context.Context, *pgxpool.Conn, *lease, error) {
	ctx, l, err := s.acquireLease(ctx)
	if err != nil {
		return ctx, nil, nil, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		err = fmt.Errorf("claimtx: retention: acquire connection: %w", err)
		l.release(&err)
		return ctx, nil, nil, err
	}
	l.conn = conn
	return context.WithValue(ctx, leaseKey{}, l), conn, l, nil
}

// claimTableKind returns the claim table's relkind: "r" plain, "p"
// partitioned; ErrNoClaimTable when it is missing.
func (s *Store) claimTableKind(ctx context.Context, q pg.Querier) (string, error) {
	var kind string
	err := q.QueryRow(ctx, `SELECT c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`, s.cfg.Schema, s.cfg.ClaimsTable).Scan(&kind)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNoClaimTable
	}
	return kind, pg.Wrap(err, "claimtx: inspect claim table")
}
