package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store/internal/claimsql"
	"github.com/claimtx/claimtx/store/internal/migrate"
	"github.com/claimtx/claimtx/store/internal/outboxsql"
)

// The plumbing below is what the middleware, the relay and the tools reach
// through internal packages; the black-box tests reach it through the
// Store they built.

// MigrationLockKeyForTest is the advisory lock key Migrate takes.
func (s *Store) MigrationLockKeyForTest() int64 { return migrate.LockKey(s.cfg.Schema) }

// MigrateDownForTest reverts the migrations above target.
func (s *Store) MigrateDownForTest(ctx context.Context, target int) error {
	return migrate.Down(ctx, s.pool, s.names, target)
}

// BeginClaimForTest begins a transaction with the claim r in it, as the
// claim middleware does.
func (s *Store) BeginClaimForTest(ctx context.Context, opts pgx.TxOptions, r ClaimRequest) (pgx.Tx, ClaimResult, error) {
	tx, res, _, err := s.claims.Begin(ctx, pg.TxOptions{TxOptions: opts}, pg.ClaimRequest(r), pg.Lookups{}, nil)
	return tx, ClaimResult(res), err
}

// BeginClaimMemoForTest is BeginClaimForTest with the poison memo lookup
// pipelined, as the claim middleware does with Claim.PoisonMemo.
func (s *Store) BeginClaimMemoForTest(ctx context.Context, opts pgx.TxOptions, r ClaimRequest) (pgx.Tx, ClaimResult, *string, error) {
	tx, res, found, err := s.claims.Begin(ctx, pg.TxOptions{TxOptions: opts}, pg.ClaimRequest(r), pg.Lookups{Memo: true}, nil)
	return tx, ClaimResult(res), found.Memo, err
}

// BeginClaimBatchForTest begins a transaction claiming keys, as the batch
// middleware does.
func (s *Store) BeginClaimBatchForTest(ctx context.Context, opts pgx.TxOptions, consumer string, keys []string, maxClaimWait time.Duration) (pgx.Tx, []string, error) {
	tx, claimed, _, _, err := s.claims.BeginBatch(ctx, pg.TxOptions{TxOptions: opts}, consumer, keys, maxClaimWait, false, nil)
	return tx, claimed, err
}

// BeginNaturalKeyForTest begins a natural-key transaction, as the claim
// middleware does in ModeNaturalKey.
func (s *Store) BeginNaturalKeyForTest(ctx context.Context, opts pgx.TxOptions, maxClaimWait time.Duration) (pgx.Tx, error) {
	return claimsql.BeginNaturalKey(ctx, s.pool, pg.TxOptions{TxOptions: opts}, maxClaimWait, nil)
}

// OutboxForTest returns the relay's statements for the Store's outbox.
func (s *Store) OutboxForTest() *outboxsql.Statements { return s.outbox }

// PartitionedForTest reports whether the claim table is partitioned.
func (s *Store) PartitionedForTest(ctx context.Context) (bool, error) {
	kind, err := s.claimTableKind(ctx, s.pool)
	return kind == "p", err
}

// SQLForTest returns the upsert's statement.
func (u *VersionedUpsert) SQLForTest() string { return u.sql }

// LockRetentionForTest takes the table's retention lease, as another
// instance mid-run holds it; the returned func releases it.
func (s *Store) LockRetentionForTest(ctx context.Context) (func(), error) {
	_, l, err := s.acquireLease(ctx)
	if err != nil {
		return nil, err
	}
	return func() {
		var err error
		l.release(&err)
	}, nil
}

// AbandonRetentionLeaseForTest takes the table's retention lease and
// never renews nor releases it, as a process killed mid-run leaves it.
func (s *Store) AbandonRetentionLeaseForTest(ctx context.Context) error {
	_, l, err := s.acquireLease(ctx)
	if err == nil {
		l.stop() // the heartbeat ends; nothing renews or releases the lease
		<-l.done
	}
	return err
}

// SetLeaseTTLForTest shortens the retention lease's time to live.
func (s *Store) SetLeaseTTLForTest(ttl time.Duration) { s.leaseTTL = ttl }

// RetentionLeaseNameForTest is the row name of the table's retention
// lease in <schema>.claimtx_lease.
func (s *Store) RetentionLeaseNameForTest() string { return s.leaseName() }
