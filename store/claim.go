package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store/internal/claimsql"
)

// ClaimRequest is one claim: the consumer, the message key, and the
// options. Only Consumer and Key are required.
type ClaimRequest struct {
	Consumer string
	Key      string
	// MaxClaimWait bounds the claim wait: the time the claim spends
	// blocked behind a concurrent twin's uncommitted claim. 0 waits as
	// long as the twin's transaction lasts.
	MaxClaimWait time.Duration
	// EventTime places the claim in the partition of the message's event
	// day (partitioned mode only; see EnablePartitioning). Zero for the
	// plain table. It must be the producer's event time of the message,
	// read the same way on every delivery (framework.TimeFunc), so that
	// twins land in the same partition and conflict there. When no
	// partition accepts the day, the claim fails with ErrNoPartition: the
	// message is expired or too far in the future, and must not be applied.
	EventTime time.Time
	// PayloadHash is stored with a new claim and, for a duplicate,
	// compared with the stored one. Nil records nothing and compares
	// nothing.
	PayloadHash []byte
}

// ClaimResult says what a claim found.
type ClaimResult struct {
	// New is true when this transaction inserted the claim.
	New bool
	// FingerprintMismatch is true for a duplicate whose stored payload
	// hash differs from the request's: the same key for different content.
	FingerprintMismatch bool
}

// Claim inserts the claim described by r in tx, a transaction of the
// caller's, and reports in res.New whether it was new. New false means an
// earlier transaction committed the same claim: the caller must not apply
// the effect. If a concurrent transaction holds the same uncommitted
// claim, Claim waits until it ends, at most r.MaxClaimWait when that is
// positive: on its commit New is false, on its rollback true; past
// r.MaxClaimWait the error is transient (IsTransient) and tx is aborted
// (retry with a fresh one). Like every claim error it aborts tx.
//
// The lock_timeout is set and reset around the claim in the same round
// trip (a pipelined batch), so the caller's own statements keep the
// session's default lock_timeout. Reset means the default from the server
// or the connection's startup parameters; a lock_timeout changed with SET
// in AfterConnect is not restored. Comparing fingerprints costs one more
// query, and only for duplicates.
//
// The claim is only durable if tx commits; that is the point. The claim
// middleware runs the same statement, pipelined with its BEGIN.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, r ClaimRequest) (ClaimResult, error) {
	res, err := s.claims.Claim(ctx, tx, claimsql.Request(r))
	return ClaimResult(res), err
}

// ClaimsByEventDay reports whether the claim table carries an event day
// (after PreparePartitioning or EnablePartitioning): claims must then say
// the message's event time (ClaimRequest.EventTime).
func (s *Store) ClaimsByEventDay(ctx context.Context) (bool, error) {
	return s.hasEventDay(ctx, s.pool)
}

func (s *Store) hasEventDay(ctx context.Context, q pg.Querier) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = $2 AND column_name = 'event_day')`, s.cfg.Schema, s.cfg.ClaimsTable).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("claimtx: inspect claim table: %w", err)
	}
	return ok, nil
}
