package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// ClaimRequest is one claim with every option. Claim, ClaimWait and
// ClaimAt are shorthands for the common cases.
type ClaimRequest struct {
	Consumer string
	Key      string
	// Wait bounds the wait behind an uncommitted twin (0: unbounded).
	Wait time.Duration
	// EventTime places the claim in the partition of the message's event
	// day (partitioned mode only; see EnablePartitioning). Zero for the
	// plain table.
	EventTime time.Time
	// PayloadHash is stored with a new claim and, for a duplicate,
	// compared with the stored one. Nil records nothing and compares
	// nothing.
	PayloadHash []byte
}

// ClaimResult says what ClaimWith found.
type ClaimResult struct {
	// New is true when this transaction inserted the claim.
	New bool
	// FingerprintMismatch is true for a duplicate whose stored payload
	// hash differs from the request's: the same key for different content.
	FingerprintMismatch bool
}

// claimStatements holds the INSERT for each combination of optional
// columns, rendered once.
type claimStatements struct {
	insert [2][2]string // [eventDay][payloadHash]
	hash   [2]string    // select payload_hash [eventDay]
	batch  string       // ClaimBatch's multi-row insert
}

func (s *Store) initClaimSQL() {
	cols := [2][2]string{
		{"(consumer, message_key) VALUES ($1, $2)", "(consumer, message_key, payload_hash) VALUES ($1, $2, $3)"},
		{"(consumer, message_key, event_day) VALUES ($1, $2, $3)", "(consumer, message_key, event_day, payload_hash) VALUES ($1, $2, $3, $4)"},
	}
	for d := 0; d < 2; d++ {
		for h := 0; h < 2; h++ {
			s.claims.insert[d][h] = s.render("INSERT INTO {schema}.{claims} " + cols[d][h] + " ON CONFLICT DO NOTHING")
		}
	}
	s.claims.hash[0] = s.render("SELECT payload_hash FROM {schema}.{claims} WHERE consumer = $1 AND message_key = $2")
	s.claims.hash[1] = s.render("SELECT payload_hash FROM {schema}.{claims} WHERE consumer = $1 AND message_key = $2 AND event_day = $3")
	s.claims.batch = s.render(`INSERT INTO {schema}.{claims} (consumer, message_key)
SELECT $1, k FROM unnest($2::text[]) WITH ORDINALITY AS u(k, i) ORDER BY i
ON CONFLICT DO NOTHING RETURNING message_key`)
}

// ClaimWith inserts the claim described by r in tx. See Claim for the
// semantics; the lock_timeout is set and reset around the claim in one
// round trip when r.Wait > 0. Comparing fingerprints costs one more query,
// and only for duplicates.
func (s *Store) ClaimWith(ctx context.Context, tx pgx.Tx, r ClaimRequest) (ClaimResult, error) {
	if tx == nil {
		return ClaimResult{}, errors.New("claimtx: Claim needs a transaction")
	}
	args := []any{r.Consumer, r.Key}
	d, h := 0, 0
	var day pgtype.Date
	if !r.EventTime.IsZero() {
		day = pgtype.Date{Time: EventDay(r.EventTime), Valid: true}
		args, d = append(args, day), 1
	}
	if r.PayloadHash != nil {
		args, h = append(args, r.PayloadHash), 1
	}
	sql := s.claims.insert[d][h]

	var res ClaimResult
	var err error
	if r.Wait <= 0 {
		var tag pgconn.CommandTag
		tag, err = tx.Exec(ctx, sql, args...)
		res.New = tag.RowsAffected() == 1
	} else {
		b := &pgx.Batch{}
		b.Queue("SELECT set_config('lock_timeout', $1, true)", strconv.FormatInt(max(r.Wait.Milliseconds(), 1), 10)+"ms")
		b.Queue(sql, args...).Exec(func(tag pgconn.CommandTag) error {
			res.New = tag.RowsAffected() == 1
			return nil
		})
		b.Queue("SET LOCAL lock_timeout TO DEFAULT")
		err = tx.SendBatch(ctx, b).Close()
	}
	if err != nil {
		if d == 1 {
			return res, eventDayClaimError(day.Time, err)
		}
		return res, fmt.Errorf("claimtx: claim: %w", err)
	}
	if res.New || r.PayloadHash == nil {
		return res, nil
	}
	hargs := []any{r.Consumer, r.Key}
	if d == 1 {
		hargs = append(hargs, day)
	}
	var stored []byte
	if err := tx.QueryRow(ctx, s.claims.hash[d], hargs...).Scan(&stored); err != nil {
		return res, fmt.Errorf("claimtx: read claim fingerprint: %w", err)
	}
	res.FingerprintMismatch = stored != nil && !bytes.Equal(stored, r.PayloadHash)
	return res, nil
}

// ClaimsByEventDay reports whether the claim table carries an event day
// (after PreparePartitioning or EnablePartitioning): claims must then say
// the message's event time (ClaimRequest.EventTime, ClaimAt).
func (s *Store) ClaimsByEventDay(ctx context.Context) (bool, error) {
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = $2 AND column_name = 'event_day')`, s.cfg.Schema, s.cfg.ClaimsTable).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("claimtx: inspect claim table: %w", err)
	}
	return ok, nil
}
