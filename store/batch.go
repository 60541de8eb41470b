package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/pgtx"
)

// BeginClaimBatch begins a transaction on a connection from the pool and
// claims many keys of one consumer in it with one statement, in one round
// trip. It returns the keys that were new (claimed by this transaction),
// sorted. Keys already claimed by committed transactions are left out:
// their messages are duplicates. Duplicate keys in the input are claimed
// once.
//
// The rows are inserted in key order, so two batches with overlapping keys
// lock them in the same order and wait for each other instead of
// deadlocking. A concurrent uncommitted claim of one of the keys makes the
// statement wait for that transaction, at most wait when wait > 0
// (lock_timeout, SQLSTATE 55P03 when it expires: CauseClaimWait, transient,
// retry). As with Claim, the timeout is set, used and reset in the same
// round trip, so it does not bound the effects that follow.
//
// On success the caller owns tx and must Commit or Rollback it; on error
// there is no transaction to end.
func (s *Store) BeginClaimBatch(ctx context.Context, opts pgx.TxOptions, consumer string, keys []string, wait time.Duration) (pgx.Tx, []string, error) {
	b := &pgx.Batch{}
	b.BeginTx(opts)
	claimed := s.queueClaimBatch(b, consumer, keys, wait)
	br := s.pool.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		pgtx.Rollback(ctx, tx)
		return nil, nil, fmt.Errorf("claimtx: claim batch: %w", err)
	}
	slices.Sort(*claimed)
	return tx, *claimed, nil
}

// queueClaimBatch queues the claim of keys (sorted and deduplicated, so
// overlapping batches lock in the same order) bounded by wait; the claimed
// keys are collected in the returned slice when the batch is read.
func (s *Store) queueClaimBatch(b *pgx.Batch, consumer string, keys []string, wait time.Duration) *[]string {
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	claimed := make([]string, 0, len(sorted))
	queueBounded(b, wait, func() {
		b.Queue(s.claims.batch, consumer, sorted).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var k string
				if err := rows.Scan(&k); err != nil {
					return err
				}
				claimed = append(claimed, k)
			}
			return rows.Err()
		})
	})
	return &claimed
}
