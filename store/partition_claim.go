package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ClaimAt is Claim for the partitioned mode: it also stores the event day
// (EventDay(eventTime)), which picks the partition. eventTime must be the
// producer's event time of the message, read the same way on every
// delivery (framework.TimeFunc), so that twins always land in the same
// partition and conflict there. wait bounds the wait behind a concurrent
// twin as in ClaimWait (0: unbounded).
//
// It works on a partitioned table and on a plain one after
// PreparePartitioning (both keep (consumer, message_key) unique, so
// consumers can switch from Claim to ClaimAt before the conversion). When
// no partition accepts the day, the error matches ErrNoPartition: the
// message is expired or too far in the future, and must not be applied.
// Like every claim error it aborts tx.
func (s *Store) ClaimAt(ctx context.Context, tx pgx.Tx, consumer, key string, eventTime time.Time, wait time.Duration) (bool, error) {
	if eventTime.IsZero() {
		return false, errors.New("claimtx: ClaimAt needs the message's event time (got the zero time)")
	}
	res, err := s.ClaimWith(ctx, tx, ClaimRequest{Consumer: consumer, Key: key, EventTime: eventTime, Wait: wait})
	return res.New, err
}

// eventDayClaimError explains the two ways a claim by event day fails for
// the table's shape rather than for the database's state.
func eventDayClaimError(day time.Time, err error) error {
	switch sqlState(err) {
	case "23514": // check_violation: no partition for the key, or the legacy boundary
		return fmt.Errorf("claimtx: claim at event day %s: %w: %w", day.Format(time.DateOnly), ErrNoPartition, err)
	case "42703": // undefined_column
		return fmt.Errorf("claimtx: claim at event day %s: the claim table has no event_day column (run PreparePartitioning or `claimtx partitions enable`): %w", day.Format(time.DateOnly), err)
	}
	return fmt.Errorf("claimtx: claim: %w", err)
}
