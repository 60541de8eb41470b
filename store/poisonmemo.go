package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
)

// Poison memos (middleware.Claim.PoisonMemo) obey the claims' retention:
// Cleanup, on a plain claim table, and DropExpiredPartitions, on one
// partitioned by event day, delete the memos last poisoned before the
// horizon. Memos are not partitioned (there are few, one per dead-lettered
// key), so both delete them by time, in batches, after the claims.

// cleanupMemos deletes the memos last poisoned before horizon, in batches
// of cfg.BatchSize on conn (the retention leader's), each its own short
// transaction with the batch timeout; with cfg.DryRun it counts them. A
// schema without the memo table (migration 004 not applied) has none. A
// role that may not delete from it (a least-privilege cleanup role
// granted rights on the claim table only, before memos existed) leaves
// the memos alone rather than failing the claims' cleanup after an
// upgrade: docs/security.md says what to grant.
func (s *Store) cleanupMemos(ctx context.Context, conn *pgxpool.Conn, horizon time.Time, cfg RetentionConfig) (int64, error) {
	need := []string{"SELECT", "DELETE"}
	if cfg.DryRun {
		need = need[:1]
	}
	exists, missing, err := pg.Lacking(ctx, conn, s.names.Render("{schema}.{memo}"), need...)
	if err != nil {
		return 0, fmt.Errorf("claimtx: check privileges on the poison memo table: %w", err)
	}
	if !exists || len(missing) > 0 {
		return 0, nil
	}
	if cfg.DryRun {
		return poison.CountMemosBefore(ctx, conn, s.names, horizon)
	}
	var total int64
	for {
		var n int64
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) (err error) {
			if err := leaseOf(ctx).renewTx(ctx, tx); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, batchSettings, pg.Millis(cfg.BatchTimeout)); err != nil {
				return err
			}
			n, err = poison.DeleteMemosBefore(ctx, tx, s.names, horizon, cfg.BatchSize)
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
