package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
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
	if tx == nil {
		return false, errors.New("claimtx: ClaimAt needs a transaction")
	}
	if eventTime.IsZero() {
		return false, errors.New("claimtx: ClaimAt needs the message's event time (got the zero time)")
	}
	day := EventDay(eventTime)
	arg := pgtype.Date{Time: day, Valid: true}
	sql := s.render("INSERT INTO {schema}.{claims} (consumer, message_key, event_day) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING")
	var claimed bool
	var err error
	if wait <= 0 {
		var tag pgconn.CommandTag
		tag, err = tx.Exec(ctx, sql, consumer, key, arg)
		claimed = tag.RowsAffected() == 1
	} else {
		// As in ClaimWait: lock_timeout set and reset around the claim in
		// one round trip, so the handler keeps the session default.
		b := &pgx.Batch{}
		b.Queue("SELECT set_config('lock_timeout', $1, true)", strconv.FormatInt(max(wait.Milliseconds(), 1), 10)+"ms")
		b.Queue(sql, consumer, key, arg).Exec(func(tag pgconn.CommandTag) error {
			claimed = tag.RowsAffected() == 1
			return nil
		})
		b.Queue("SET LOCAL lock_timeout TO DEFAULT")
		err = tx.SendBatch(ctx, b).Close()
	}
	if err == nil {
		return claimed, nil
	}
	switch sqlState(err) {
	case "23514": // check_violation: no partition for the key, or the legacy boundary
		return false, fmt.Errorf("claimtx: claim at event day %s: %w: %w", day.Format(time.DateOnly), ErrNoPartition, err)
	case "42703": // undefined_column
		return false, fmt.Errorf("claimtx: claim at event day %s: the claim table has no event_day column (run PreparePartitioning or `claimtx partitions enable`): %w", day.Format(time.DateOnly), err)
	}
	return false, fmt.Errorf("claimtx: claim: %w", err)
}
