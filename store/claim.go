package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/claimtx/claimtx/internal/pgtx"
)

// ClaimRequest is one claim: the consumer, the message key, and the
// options. Only Consumer and Key are required.
type ClaimRequest struct {
	Consumer string
	Key      string
	// Wait bounds the wait behind an uncommitted twin (0: unbounded).
	Wait time.Duration
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

// claimShape says which optional columns a claim carries.
type claimShape struct {
	eventDay    bool // ClaimRequest.EventTime is set
	payloadHash bool // ClaimRequest.PayloadHash is set
}

// claimShapes lists every shape, to render their statements once.
var claimShapes = []claimShape{{false, false}, {false, true}, {true, false}, {true, true}}

// insertSQL is the claim INSERT for the shape, with {schema} and {claims}
// still to render: consumer and message_key, then event_day and
// payload_hash when the shape has them, as $1, $2, ….
func (sh claimShape) insertSQL() string {
	cols := []string{"consumer", "message_key"}
	if sh.eventDay {
		cols = append(cols, "event_day")
	}
	if sh.payloadHash {
		cols = append(cols, "payload_hash")
	}
	params := make([]string, len(cols))
	for i := range params {
		params[i] = "$" + strconv.Itoa(i+1)
	}
	return "INSERT INTO {schema}.{claims} (" + strings.Join(cols, ", ") + ") VALUES (" + strings.Join(params, ", ") + ") ON CONFLICT DO NOTHING"
}

// claimStatements holds the claim statements, rendered once.
type claimStatements struct {
	insert    map[claimShape]string
	hash      string // the stored payload hash of a claim without event day
	hashByDay string // the same, with the event day
	batch     string // BeginClaimBatch's multi-row insert
}

func (s *Store) initClaimSQL() {
	s.claims.insert = make(map[claimShape]string, len(claimShapes))
	for _, sh := range claimShapes {
		s.claims.insert[sh] = s.render(sh.insertSQL())
	}
	s.claims.hash = s.render("SELECT payload_hash FROM {schema}.{claims} WHERE consumer = $1 AND message_key = $2")
	s.claims.hashByDay = s.render("SELECT payload_hash FROM {schema}.{claims} WHERE consumer = $1 AND message_key = $2 AND event_day = $3")
	s.claims.batch = s.render(`INSERT INTO {schema}.{claims} (consumer, message_key)
SELECT $1, k FROM unnest($2::text[]) WITH ORDINALITY AS u(k, i) ORDER BY i
ON CONFLICT DO NOTHING RETURNING message_key`)
}

// Claim inserts the claim described by r in tx, a transaction of the
// caller's, and reports in res.New whether it was new. New false means an
// earlier transaction committed the same claim: the caller must not apply
// the effect. If a concurrent transaction holds the same uncommitted
// claim, Claim waits until it ends, at most r.Wait when r.Wait > 0: on its
// commit New is false, on its rollback true; past r.Wait the error
// classifies as CauseClaimWait and tx is aborted (retry with a fresh one).
// Like every claim error it aborts tx.
//
// The lock_timeout is set and reset around the claim in the same round
// trip (a pipelined batch), so the caller's own statements keep the
// session's default lock_timeout. Reset means the default from the server
// or the connection's startup parameters; a lock_timeout changed with SET
// in AfterConnect is not restored. Comparing fingerprints costs one more
// query, and only for duplicates.
//
// The claim is only durable if tx commits; that is the point. BeginClaim
// does the same in a transaction it begins, one round trip fewer.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, r ClaimRequest) (ClaimResult, error) {
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
// (pgx's Batch.BeginTx), where BeginTx followed by Claim takes two.
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
	sql   string
	args  []any
	r     ClaimRequest
	shape claimShape
	day   pgtype.Date // when shape.eventDay
	res   *ClaimResult
}

func (s *Store) prepareClaim(r ClaimRequest, res *ClaimResult) claimQuery {
	q := claimQuery{args: []any{r.Consumer, r.Key}, r: r, res: res}
	q.shape = claimShape{eventDay: !r.EventTime.IsZero(), payloadHash: r.PayloadHash != nil}
	if q.shape.eventDay {
		q.day = pgtype.Date{Time: EventDay(r.EventTime), Valid: true}
		q.args = append(q.args, q.day)
	}
	if q.shape.payloadHash {
		q.args = append(q.args, r.PayloadHash)
	}
	q.sql = s.claims.insert[q.shape]
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
	if q.shape.eventDay {
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
	sql, hargs := s.claims.hash, []any{q.r.Consumer, q.r.Key}
	if q.shape.eventDay {
		sql, hargs = s.claims.hashByDay, append(hargs, q.day)
	}
	var stored []byte
	if err := tx.QueryRow(ctx, sql, hargs...).Scan(&stored); err != nil {
		return fmt.Errorf("claimtx: read claim fingerprint: %w", err)
	}
	res.FingerprintMismatch = stored != nil && !bytes.Equal(stored, q.r.PayloadHash)
	return nil
}

// ClaimsByEventDay reports whether the claim table carries an event day
// (after PreparePartitioning or EnablePartitioning): claims must then say
// the message's event time (ClaimRequest.EventTime).
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
