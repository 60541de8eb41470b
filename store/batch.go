package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// ClaimBatch claims many keys of one consumer in one statement and returns
// the keys that were new (claimed by this transaction), sorted. Keys
// already claimed by committed transactions are left out: their messages
// are duplicates. Duplicate keys in the input are claimed once.
//
// The rows are inserted in key order, so two batches with overlapping keys
// lock them in the same order and wait for each other instead of
// deadlocking. A concurrent uncommitted claim of one of the keys makes the
// statement wait for that transaction, as Claim does (bound it with a
// lock_timeout, e.g. through ClaimBatchWait).
func (s *Store) ClaimBatch(ctx context.Context, tx pgx.Tx, consumer string, keys []string) ([]string, error) {
	if tx == nil {
		return nil, errors.New("claimtx: ClaimBatch needs a transaction")
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	rows, err := tx.Query(ctx, s.render(`INSERT INTO {schema}.{claims} (consumer, message_key)
SELECT $1, k FROM unnest($2::text[]) WITH ORDINALITY AS u(k, i) ORDER BY i
ON CONFLICT DO NOTHING RETURNING message_key`), consumer, sorted)
	if err != nil {
		return nil, fmt.Errorf("claimtx: claim batch: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("claimtx: claim batch: %w", err)
	}
	slices.Sort(claimed)
	return claimed, nil
}
