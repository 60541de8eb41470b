package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/pg"
)

// ClaimRequest is one claim: the consumer, the message key, and the
// options. Only Consumer and Key are required.
type ClaimRequest struct {
	Consumer string
	Key      string
	// MaxClaimWait bounds the time the claim spends blocked behind a
	// concurrent twin's uncommitted claim; 0 waits as long as it lasts.
	MaxClaimWait time.Duration
	// EventTime places the claim in the partition of the message's event
	// day (partitioned mode only; zero for the plain table). It must be the
	// producer's event time, read the same way on every delivery
	// (framework.TimeFunc), so that twins conflict in one partition.
	EventTime time.Time
	// PayloadHash is stored with a new claim and, for a duplicate,
	// compared with the stored one. Nil records nothing and compares
	// nothing.
	PayloadHash []byte
}

// ClaimResult says what a claim found.
type ClaimResult struct {
	New bool // this transaction inserted the claim
	// FingerprintMismatch is true for a duplicate whose stored payload
	// hash differs from the request's: the same key for different content.
	FingerprintMismatch bool
}

// Claim inserts the claim r in tx, a transaction of the caller's, and
// reports in res.New whether it was new; false means an earlier
// transaction committed it: do not apply the effect. Behind a concurrent
// uncommitted twin it waits, at most r.MaxClaimWait when positive, and
// past that fails transiently (IsTransient); every claim error aborts tx.
// The lock_timeout is set and reset around the claim in its round trip,
// back to the session's default (a SET in AfterConnect is not restored).
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, r ClaimRequest) (ClaimResult, error) {
	res, err := s.claims.Claim(ctx, tx, pg.ClaimRequest(r))
	return ClaimResult(res), err
}

// ClaimsByEventDay reports whether the claim table carries an event day
// (after PreparePartitioning): claims must then set ClaimRequest.EventTime.
func (s *Store) ClaimsByEventDay(ctx context.Context) (bool, error) {
	return s.hasEventDay(ctx, s.pool)
}

func (s *Store) hasEventDay(ctx context.Context, q pg.Querier) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = $2 AND column_name = 'event_day')`, s.cfg.Schema, s.cfg.ClaimsTable).Scan(&ok)
	return ok, pg.Wrap(err, "claimtx: inspect claim table")
}
