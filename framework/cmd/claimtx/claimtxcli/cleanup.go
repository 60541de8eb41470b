package claimtxcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store"
)

func init() {
	synopses["cleanup"] = "Delete claims older than the retention window, in batches. Interrupt it to stop after the current batch; run it again to resume."
}

func cmdCleanup(ctx context.Context, args []string, stdout, _ io.Writer, getenv env, _ Config) error {
	fs, c := newFlags("cleanup", stdout, getenv)
	var cfg store.RetentionConfig
	window := newRetentionFlags("window", "min-window")
	window.register(fs, &cfg, "keep claims processed within this window", "refuse windows below this unless --force", "window")
	fs.IntVar(&cfg.BatchSize, "batch-size", pg.DefaultBatchSize, "rows in the first batch; later batches adapt")
	// 0: the store derives these from --batch-size.
	fs.IntVar(&cfg.MinBatchSize, "min-batch-size", 0, fmt.Sprintf("smallest adaptive batch (default %d, or --batch-size if smaller)", pg.DefaultMinBatchSize))
	fs.IntVar(&cfg.MaxBatchSize, "max-batch-size", 0, fmt.Sprintf("largest adaptive batch (default %d, or --batch-size if larger)", pg.DefaultMaxBatchSize))
	fs.DurationVar(&cfg.TargetBatchDuration, "target-batch-duration", pg.DefaultTargetBatchDuration, "adapt batch sizes toward this duration")
	fs.DurationVar(&cfg.Pause, "pause", pg.DefaultBatchPause, "pause between batches (negative: none)")
	fs.DurationVar(&cfg.BatchTimeout, "batch-timeout", pg.DefaultBatchTimeout, "statement timeout of one batch")
	fs.BoolVar(&cfg.DryRun, "dry-run", false, "count what would be deleted, delete nothing")
	fs.BoolVar(&cfg.Vacuum, "vacuum", false, "VACUUM (ANALYZE) the table afterwards")
	mode := fs.String("progress", "auto", "progress display: auto (a bar on a terminal, log lines otherwise), bar, log or none")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	switch *mode {
	case "auto":
		*mode = barOrLog(stdout)
	case "bar", "log", "none":
	default:
		return &usageError{msg: fmt.Sprintf("cleanup: --progress %q: want auto, bar, log or none", *mode)}
	}
	if err := window.apply("cleanup", &cfg); err != nil {
		return err
	}
	st, closePool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closePool()

	if cfg.DryRun {
		res, err := st.Cleanup(ctx, cfg)
		if err != nil {
			return c.fail(ctx, "cleanup", err)
		}
		oldest := "none"
		if !res.Oldest.IsZero() {
			oldest = res.Oldest.UTC().Format(time.RFC3339)
		}
		printf(stdout, "dry run: %d claims in %s processed before %s would be deleted (oldest %s)\n",
			res.WouldDelete, tableName(st), res.Horizon.UTC().Format(time.RFC3339), oldest)
		if res.Memos > 0 {
			printf(stdout, "dry run: %d poison memos last poisoned before then would be deleted\n", res.Memos)
		}
		return nil
	}
	pp := &progressPrinter{progress: progress{w: stdout, mode: *mode, now: time.Now}}
	cfg.OnProgress = func(pr store.CleanupResult) {
		if pr.Batches == 0 && pp.mode != "none" {
			pp.total, pp.counted = c.countExpired(ctx, st, pr.Horizon)
		}
		pp.update(pr)
	}
	res, err := st.Cleanup(ctx, cfg)
	pp.finish()
	if errors.Is(err, store.ErrNotLeader) {
		printf(stdout, "not leader: another cleaner holds the retention lease on %s; nothing done\n", tableName(st))
		return nil
	}
	summary := fmt.Sprintf("%d claims processed before %s deleted from %s in %d batches, %s (%s claims/s)",
		res.Deleted, res.Horizon.UTC().Format(time.RFC3339), tableName(st), res.Batches, res.Duration.Round(time.Millisecond), formatRate(res.Deleted, res.Duration))
	if err != nil {
		if ctx.Err() != nil {
			printlnTo(stdout, "interrupted:", summary+"; run again to resume")
		}
		return c.fail(ctx, "cleanup", err)
	}
	if res.Memos > 0 {
		summary += fmt.Sprintf("; %d poison memos deleted", res.Memos)
	}
	if res.Vacuumed {
		summary += ", then vacuumed"
	}
	printlnTo(stdout, summary)
	return nil
}

// countBudget bounds the count that gives the cleanup progress its total.
const countBudget = 2 * time.Second

// countExpired counts the claims processed before horizon exactly, if that
// takes less than countBudget. Estimates lag behind an earlier cleanup
// until the next ANALYZE (2.7x too many in the test): no total is better
// than a false one. New claims cannot fall below a past horizon, and the
// retention lease keeps other cleaners out, so the count stays right.
func (c *common) countExpired(ctx context.Context, st *store.Store, horizon time.Time) (n int64, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, countBudget+time.Second)
	defer cancel()
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return 0, false
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// A server-side timeout leaves the connection usable for the batches.
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", countBudget.Milliseconds())); err != nil {
		return 0, false
	}
	table := pgx.Identifier{st.Config().Schema, st.Config().ClaimsTable}.Sanitize()
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE processed_at < $1", horizon).Scan(&n); err != nil {
		return 0, false
	}
	return n, true
}

func formatRate(n int64, d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return strconv.FormatInt(int64(float64(n)/d.Seconds()), 10)
}
