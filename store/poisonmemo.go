package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store/internal/poisonsql"
)

// memoDB is the pool (a dry run) or the retention leader's connection.
type memoDB interface {
	pg.DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

// cleanupMemos deletes (cfg.DryRun: counts) the poison memos last
// poisoned before horizon, in batches of cfg.BatchSize: memos are few and
// not partitioned, so both retention modes delete them by time. A role
// that may not delete them (granted rights before memos existed) leaves
// them alone rather than fail the claims' cleanup (docs/security.md).
func (s *Store) cleanupMemos(ctx context.Context, db memoDB, horizon time.Time, cfg RetentionConfig) (int64, error) {
	need := []string{"SELECT", "DELETE"}
	if cfg.DryRun {
		need = need[:1]
	}
	exists, missing, err := poisonsql.Lacking(ctx, db, s.names.Render("{schema}.{memo}"), need...)
	if err != nil {
		return 0, fmt.Errorf("claimtx: check privileges on the poison memo table: %w", err)
	}
	if !exists || len(missing) > 0 {
		return 0, nil
	}
	if cfg.DryRun {
		return poisonsql.CountMemosBefore(ctx, db, s.names, horizon)
	}
	var total int64
	for {
		var n int64
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) (err error) {
			if err := leaseOf(ctx).renewTx(ctx, tx); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, batchSettings, pg.Millis(cfg.BatchTimeout)); err != nil {
				return err
			}
			n, err = poisonsql.DeleteMemosBefore(ctx, tx, s.names, horizon, cfg.BatchSize)
			return err
		})
		if err != nil {
			return total, fmt.Errorf("claimtx: delete expired poison memos: %w", err)
		}
		total += n
		if n < int64(cfg.BatchSize) {
			return total, nil
		}
		if cfg.Pause > 0 {
			if err := pg.Sleep(ctx, cfg.Pause); err != nil {
				return total, fmt.Errorf("claimtx: delete expired poison memos: %w", err)
			}
		}
	}
}
