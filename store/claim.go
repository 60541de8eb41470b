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

	"github.com/claimtx/claimtx/internal/pgtx"
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
	var res ClaimResult
	q := s.prepareClaim(r, &res)
	var err error
	if r.Wait <= 0 {
		var tag pgconn.CommandTag
		tag, err = tx.Exec(ctx, q.sql, q.args...)
		res.New = tag.RowsAffected() == 1
	} else {
		b := &pgx.Batch{}
		q.queue(b)
		err = tx.SendBatch(ctx, b).Close()
	}
	if err != nil {
		return res, q.wrap(err)
	}
	return res, s.checkFingerprint(ctx, tx, q, &res)
}

// BeginClaim begins a transaction on a connection from the pool and makes
// the claim described by r in it, in one round trip: BEGIN, the
// lock_timeout, the claim and the reset go out as one pipelined batch
// (pgx's Batch.BeginTx), where BeginTx followed by ClaimWith takes two.
// For a transaction per message that is one round trip of four or five.
//
// On success the caller owns tx, with the claim in it, and must Commit or
// Rollback it whatever res says. On error there is no transaction to end.
func (s *Store) BeginClaim(ctx context.Context, opts pgx.TxOptions, r ClaimRequest) (tx pgx.Tx, res ClaimResult, err error) {
	q := s.prepareClaim(r, &res)
	b := &pgx.Batch{}
	b.BeginTx(opts)
	q.queue(b)
	br := s.pool.SendBatch(ctx, b)
	tx = br.Tx()
	if err := br.Close(); err != nil {
		// A claim that failed (lock_timeout, a missing partition) leaves
		// the transaction open and aborted; a failed BEGIN leaves it
		// closed, and Rollback then only returns the connection.
		pgtx.Rollback(ctx, tx)
		return nil, res, q.wrap(err)
	}
	if err := s.checkFingerprint(ctx, tx, q, &res); err != nil {
		pgtx.Rollback(ctx, tx)
		return nil, res, err
	}
	return tx, res, nil
}

// BeginNaturalKey begins a transaction on a connection from the pool for a
// natural-key claim, where the claim is the effect's own guarded INSERT:
// BEGIN and a lock_timeout of wait for the whole transaction go out in one
// round trip, so the guarded INSERT waits at most wait behind a twin's
// uncommitted row (the error then classifies as CauseClaimWait). wait <= 0
// sets no timeout. On success the caller owns tx and must Commit or
// Rollback it; on error there is no transaction to end.
func (s *Store) BeginNaturalKey(ctx context.Context, opts pgx.TxOptions, wait time.Duration) (pgx.Tx, error) {
	b := &pgx.Batch{}
	b.BeginTx(opts)
	if wait > 0 {
		b.Queue("SELECT set_config('lock_timeout', $1, true)", lockTimeout(wait))
	}
	br := s.pool.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		pgtx.Rollback(ctx, tx)
		return nil, fmt.Errorf("claimtx: begin: %w", err)
	}
	return tx, nil
}

// lockTimeout renders d for set_config('lock_timeout', …): whole
// milliseconds, at least 1 (0 would mean "wait forever").
func lockTimeout(d time.Duration) string {
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10) + "ms"
}

// claimQuery is one claim statement with its arguments, ready to queue.
type claimQuery struct {
	sql  string
	args []any
	r    ClaimRequest
	d    int // 1 when the claim carries an event day
	day  pgtype.Date
	res  *ClaimResult
}

func (s *Store) prepareClaim(r ClaimRequest, res *ClaimResult) claimQuery {
	q := claimQuery{args: []any{r.Consumer, r.Key}, r: r, res: res}
	h := 0
	if !r.EventTime.IsZero() {
		q.day = pgtype.Date{Time: EventDay(r.EventTime), Valid: true}
		q.args, q.d = append(q.args, q.day), 1
	}
	if r.PayloadHash != nil {
		q.args, h = append(q.args, r.PayloadHash), 1
	}
	q.sql = s.claims.insert[q.d][h]
	return q
}

// queue adds the claim to b, between setting and resetting lock_timeout
// when the request bounds its wait: the timeout then covers the claim
// only, not the effects that follow in the transaction.
func (q claimQuery) queue(b *pgx.Batch) {
	queueBounded(b, q.r.Wait, func() {
		b.Queue(q.sql, q.args...).Exec(func(tag pgconn.CommandTag) error {
			q.res.New = tag.RowsAffected() == 1
			return nil
		})
	})
}

// queueBounded queues what queue adds to b between setting lock_timeout
// to wait and resetting it (nothing around it when wait <= 0), so the
// timeout bounds those statements only.
func queueBounded(b *pgx.Batch, wait time.Duration, queue func()) {
	if wait <= 0 {
		queue()
		return
	}
	b.Queue("SELECT set_config('lock_timeout', $1, true)", lockTimeout(wait))
	queue()
	b.Queue("SET LOCAL lock_timeout TO DEFAULT")
}

func (q claimQuery) wrap(err error) error {
	if q.d == 1 {
		return eventDayClaimError(q.day.Time, err)
	}
	return fmt.Errorf("claimtx: claim: %w", err)
}

// checkFingerprint compares, for a duplicate, the stored payload hash with
// the request's.
func (s *Store) checkFingerprint(ctx context.Context, tx pgx.Tx, q claimQuery, res *ClaimResult) error {
	if res.New || q.r.PayloadHash == nil {
		return nil
	}
	hargs := []any{q.r.Consumer, q.r.Key}
	if q.d == 1 {
		hargs = append(hargs, q.day)
	}
	var stored []byte
	if err := tx.QueryRow(ctx, s.claims.hash[q.d], hargs...).Scan(&stored); err != nil {
		return fmt.Errorf("claimtx: read claim fingerprint: %w", err)
	}
	res.FingerprintMismatch = stored != nil && !bytes.Equal(stored, q.r.PayloadHash)
	return nil
}

// ClaimsByEventDay reports whether the claim table carries an event day
// (after PreparePartitioning or EnablePartitioning): claims must then say
// the message's event time (ClaimRequest.EventTime, ClaimAt).
func (s *Store) ClaimsByEventDay(ctx context.Context) (bool, error) {
	return s.hasEventDay(ctx, s.pool)
}

func (s *Store) hasEventDay(ctx context.Context, q querier) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = $2 AND column_name = 'event_day')`, s.cfg.Schema, s.cfg.ClaimsTable).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("claimtx: inspect claim table: %w", err)
	}
	return ok, nil
}
