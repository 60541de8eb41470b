package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/pgtx"
)

// ClaimBatch claims many keys of one consumer in one statement and returns
// the keys that were new (claimed by this transaction), sorted. Keys
// already claimed by committed transactions are left out: their messages
// are duplicates. Duplicate keys in the input are claimed once.
//
// The rows are inserted in key order, so two batches with overlapping keys
// lock them in the same order and wait for each other instead of
// deadlocking. A concurrent uncommitted claim of one of the keys makes the
// statement wait for that transaction, as Claim does (bound it with
// ClaimBatchWait).
func (s *Store) ClaimBatch(ctx context.Context, tx pgx.Tx, consumer string, keys []string) ([]string, error) {
	return s.ClaimBatchWait(ctx, tx, consumer, keys, 0)
}

// ClaimBatchWait is ClaimBatch with the statement's wait behind
// uncommitted twins bounded by wait (lock_timeout, SQLSTATE 55P03 when it
// expires: transient, retry the transaction). As with ClaimWith, the
// timeout is set, used and reset in one round trip, so it does not bound
// the effects that follow. wait <= 0 waits as long as the twin runs.
func (s *Store) ClaimBatchWait(ctx context.Context, tx pgx.Tx, consumer string, keys []string, wait time.Duration) ([]string, error) {
	if tx == nil {
		return nil, errors.New("claimtx: ClaimBatch needs a transaction")
	}
	b := &pgx.Batch{}
	claimed := s.queueClaimBatch(b, consumer, keys, wait)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("claimtx: claim batch: %w", err)
	}
	slices.Sort(*claimed)
	return *claimed, nil
}

// BeginClaimBatch is BeginClaim for ClaimBatchWait: it begins a transaction
// on a connection from the pool and claims keys in it, in one round trip.
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
