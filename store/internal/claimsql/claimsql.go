// Package claimsql holds the claim statements and the transactions that
// begin with a claim, shared by Store.Claim and the claim middleware.
package claimsql

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/internal/pg"
)

// ErrNoPartition is store.ErrNoPartition (see there): a claim by event day
// that no partition accepts.
var ErrNoPartition = errors.New("claimtx: no claim partition for the message's event day")

// shape says which optional columns a claim carries.
type shape struct {
	eventDay    bool // ClaimRequest.EventTime is set
	payloadHash bool // ClaimRequest.PayloadHash is set
}

// Statements are the claim statements of one claim table, rendered once.
type Statements struct {
	insert    map[shape]string
	hash      string // the stored payload hash of a claim without event day
	hashByDay string // the same, with the event day
	batch     string // BeginBatch's multi-row insert
	// The poison memo lookups, and the undo of batch claims of memoised keys.
	memo, memoBatch, unclaim string
	// The parked order-key lookups (migration 009), FOR SHARE: alone, and
	// in the statement that sets the claim's lock_timeout (and
	// synchronous_commit), where Begin sends it.
	parked, parkedBatch              string
	parkedTimeout, parkedTimeoutSync string
	following                        string // Following's read-ahead
	// Pool runs Begin, BeginBatch and Following; the store sets it.
	Pool *pgxpool.Pool
}

// For renders, once, the statements of the claim table claims in schema
// (names store.Config validated).
func For(schema, claims string) *Statements {
	n := pg.NewNames(schema, claims, "")
	s := &Statements{insert: map[shape]string{
		{false, false}: n.Render("INSERT INTO {schema}.{claims} (consumer, message_key) VALUES ($1, $2) ON CONFLICT DO NOTHING"),
		{false, true}:  n.Render("INSERT INTO {schema}.{claims} (consumer, message_key, payload_hash) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"),
		{true, false}:  n.Render("INSERT INTO {schema}.{claims} (consumer, message_key, event_day) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"),
		{true, true}:   n.Render("INSERT INTO {schema}.{claims} (consumer, message_key, event_day, payload_hash) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING"),
	}}
	s.hash = n.Render("SELECT payload_hash FROM {schema}.{claims} WHERE consumer = $1 AND message_key = $2")
	s.hashByDay = n.Render("SELECT payload_hash FROM {schema}.{claims} WHERE consumer = $1 AND message_key = $2 AND event_day = $3")
	s.batch = n.Render(`INSERT INTO {schema}.{claims} (consumer, message_key)
SELECT $1, k FROM unnest($2::text[]) WITH ORDINALITY AS u(k, i) ORDER BY i
ON CONFLICT DO NOTHING RETURNING message_key`)
	s.memo = n.Render("SELECT reason FROM {schema}.{memo} WHERE consumer = $1 AND message_key = $2")
	s.memoBatch = n.Render("SELECT message_key, reason FROM {schema}.{memo} WHERE consumer = $1 AND message_key = ANY($2::text[])")
	s.unclaim = n.Render("DELETE FROM {schema}.{claims} WHERE consumer = $1 AND message_key = ANY($2::text[])")
	s.parked = n.Render("SELECT true FROM {schema}.{parked_keys} WHERE consumer = $1 AND order_key = $2 FOR SHARE")
	// set_config comes first: a SELECT list is evaluated in order, so the
	// lookup's lock wait is bounded by the timeout it sets.
	exists := func(consumer, orderKey int) string {
		return n.Render(fmt.Sprintf("EXISTS (SELECT FROM {schema}.{parked_keys} WHERE consumer = $%d AND order_key = $%d FOR SHARE)", consumer, orderKey))
	}
	s.parkedTimeout = setLockTimeout + ", " + exists(2, 3)
	s.parkedTimeoutSync = setLockTimeoutSync + ", " + exists(3, 4)
	s.parkedBatch = n.Render("SELECT order_key FROM {schema}.{parked_keys} WHERE consumer = $1 AND order_key = ANY($2::text[]) ORDER BY order_key FOR SHARE")
	// The anchor comes in as subqueries (InitPlans) so the planner walks
	// the processed_at index from it (joined, or compared only as a row,
	// it scans from the start). message_key orders the claims of one
	// transaction, which share their processed_at.
	s.following = n.Render(`WITH a AS (
	SELECT processed_at, message_key FROM {schema}.{claims}
	WHERE consumer = $1 AND message_key = ANY($2::text[])
	ORDER BY processed_at, message_key LIMIT 1)
SELECT c.message_key FROM {schema}.{claims} c
WHERE c.consumer = $1 AND c.processed_at >= (SELECT processed_at FROM a)
	AND (c.processed_at, c.message_key) > (SELECT processed_at, message_key FROM a)
ORDER BY c.processed_at, c.message_key LIMIT $3`)
	return s
}

// Claim inserts the claim r in tx; see store.Store.Claim.
func (s *Statements) Claim(ctx context.Context, tx pgx.Tx, r pg.ClaimRequest) (pg.ClaimResult, error) {
	if tx == nil {
		return pg.ClaimResult{}, errors.New("claimtx: Claim needs a transaction")
	}
	var res pg.ClaimResult
	q := s.prepare(r, &res)
	b := &pgx.Batch{}
	// The caller's transaction keeps its own synchronous_commit.
	q.queue(b, "", nil)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return res, q.wrap(err)
	}
	return res, s.checkFingerprint(ctx, tx, q, &res)
}

// Begin begins a transaction on s.Pool and makes the claim r in it, in
// one pipelined round trip: BEGIN, the memo lookup when look.Memo, the
// settings, the parked lookup of look.OrderKey (before the claim, so that
// a claim takes the key row's lock first, as a release does), the claim,
// more when not nil (a Kafka position) and the lock_timeout reset.
//
// The claim is made whatever the memo says, and the caller decides (a new
// claim with a memo is rolled back): an INSERT skipping memoised keys
// would need both decisions in one snapshot, and under READ COMMITTED a
// memo cleared in between would make a fresh message look like a
// duplicate. On success the caller owns tx whatever res says; on error
// there is no transaction to end.
func (s *Statements) Begin(ctx context.Context, opts pg.TxOptions, r pg.ClaimRequest, look pg.Lookups, more func(*pgx.Batch)) (tx pgx.Tx, res pg.ClaimResult, found pg.Found, err error) {
	q := s.prepare(r, &res)
	b := &pgx.Batch{}
	b.BeginTx(opts.TxOptions)
	// memo and parked, not named results, are captured by the callbacks:
	// that would move them to the heap on every claim.
	var memo *pgtype.Text
	if look.Memo {
		memo = s.queueMemo(b, r.Consumer, r.Key)
	}
	parked := s.queueParked(&q, r.Consumer, look.OrderKey)
	q.queue(b, opts.SynchronousCommit, more)
	br := s.Pool.SendBatch(ctx, b)
	tx = br.Tx()
	if err := br.Close(); err != nil {
		// A failed claim leaves the transaction open and aborted; after a
		// failed BEGIN, Rollback only returns the connection.
		pg.Rollback(ctx, tx)
		return nil, res, found, q.wrap(err)
	}
	if err := s.checkFingerprint(ctx, tx, q, &res); err != nil {
		pg.Rollback(ctx, tx)
		return nil, res, found, err
	}
	return tx, res, foundOf(memo, parked), nil
}

// foundOf is what the lookups queued with queueMemo and queueParked found.
func foundOf(memo *pgtype.Text, parked *bool) pg.Found {
	var f pg.Found
	if memo != nil && memo.Valid {
		f.Memo = &memo.String
	}
	f.Parked = parked != nil && *parked
	return f
}

// queueParked makes q look orderKey up among the parked keys before its
// claim; the result says whether it is parked. Nil when orderKey is "".
func (s *Statements) queueParked(q *query, consumer, orderKey string) *bool {
	if orderKey == "" {
		return nil
	}
	parked := new(bool)
	q.before = func(b *pgx.Batch) {
		b.Queue(s.parked, consumer, orderKey).QueryRow(func(row pgx.Row) error {
			if err := row.Scan(parked); err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("claimtx: read parked order key: %w", err)
			}
			return nil
		})
	}
	// With a lock_timeout to set, the lookup rides in that statement: one
	// statement less for the server per ordered message.
	q.settings = func(b *pgx.Batch, wait time.Duration, synchronousCommit string) {
		read := func(row pgx.Row) error {
			dest := []any{nil, parked}
			if synchronousCommit != "" {
				dest = []any{nil, nil, parked}
			}
			if err := row.Scan(dest...); err != nil {
				return fmt.Errorf("claimtx: read parked order key: %w", err)
			}
			return nil
		}
		if synchronousCommit != "" {
			b.Queue(s.parkedTimeoutSync, pg.Millis(wait), synchronousCommit, consumer, orderKey).QueryRow(read)
			return
		}
		b.Queue(s.parkedTimeout, pg.Millis(wait), consumer, orderKey).QueryRow(read)
	}
	return parked
}

// BeginBatch begins a transaction on s.Pool and claims many keys of one
// consumer in it with one statement in one round trip, bounded by
// maxClaimWait, and returns the new keys, sorted. Rows are inserted in key
// order, so overlapping batches wait for each other instead of
// deadlocking. withMemo looks the keys' memos up in the same round trip:
// new keys with a memo are unclaimed again in tx and returned in memos
// (key -> reason) instead. Ownership of tx is as in Begin.
func (s *Statements) BeginBatch(ctx context.Context, opts pg.TxOptions, consumer string, keys []string, maxClaimWait time.Duration, withMemo bool, orderKeys []string) (pgx.Tx, []string, map[string]string, map[string]bool, error) {
	b := &pgx.Batch{}
	b.BeginTx(opts.TxOptions)
	// found: key -> reason, captured as in Begin.
	var found map[string]string
	if withMemo {
		m := map[string]string{}
		b.Queue(s.memoBatch, consumer, keys).Query(func(rows pgx.Rows) error {
			var k, reason string
			_, err := pgx.ForEachRow(rows, []any{&k, &reason}, func() error {
				m[k] = reason
				return nil
			})
			return err
		})
		found = m
	}
	sorted := slices.Compact(slices.Sorted(slices.Values(keys)))
	claimed := make([]string, 0, len(sorted))
	var parked map[string]bool
	queueBounded(b, maxClaimWait, opts.SynchronousCommit, func() {
		if len(orderKeys) > 0 {
			parked = map[string]bool{}
			ok := slices.Compact(slices.Sorted(slices.Values(orderKeys)))
			b.Queue(s.parkedBatch, consumer, ok).Query(func(rows pgx.Rows) error {
				var k string
				_, err := pgx.ForEachRow(rows, []any{&k}, func() error {
					parked[k] = true
					return nil
				})
				return err
			})
		}
		b.Queue(s.batch, consumer, sorted).Query(func(rows pgx.Rows) (err error) {
			claimed, err = pgx.AppendRows(claimed, rows, pgx.RowTo[string])
			return err
		})
	})
	br := s.Pool.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		pg.Rollback(ctx, tx)
		return nil, nil, nil, nil, fmt.Errorf("claimtx: claim batch: %w", err)
	}
	slices.Sort(claimed)
	if len(found) == 0 {
		return tx, claimed, nil, parked, nil
	}
	// New claims of memoised keys must not commit: undo them in tx.
	var keep, undo []string
	memos := map[string]string{}
	for _, k := range claimed {
		if reason, ok := found[k]; ok {
			undo, memos[k] = append(undo, k), reason
		} else {
			keep = append(keep, k)
		}
	}
	if len(undo) > 0 {
		if _, err := tx.Exec(ctx, s.unclaim, consumer, undo); err != nil {
			pg.Rollback(ctx, tx)
			return nil, nil, nil, nil, fmt.Errorf("claimtx: claim batch: unclaim memoised keys: %w", err)
		}
	}
	return tx, keep, memos, parked, nil
}

// Following reads ahead of a replay, which delivers its messages in about
// the order they were first applied: the keys of consumer's committed
// claims written after the earliest claim among anchors, in processed_at
// order, at most n, each passed to add. On a table shared by many
// consumers the index walk also reads the others' claims of the period.
func (s *Statements) Following(ctx context.Context, consumer string, anchors []string, n int, add func(key string)) error {
	rows, err := s.Pool.Query(ctx, s.following, consumer, anchors, n)
	if err == nil {
		var k string
		_, err = pgx.ForEachRow(rows, []any{&k}, func() error {
			add(k)
			return nil
		})
	}
	return pg.Wrap(err, "claimtx: read ahead")
}

// BeginNaturalKey begins a transaction on pool for a natural-key claim,
// where the claim is the effect's own guarded INSERT: BEGIN, a
// lock_timeout of maxClaimWait (none when <= 0) for the whole transaction
// with opts' synchronous_commit, and more when not nil go out in one round
// trip. Ownership of tx is as in Begin.
func BeginNaturalKey(ctx context.Context, pool *pgxpool.Pool, opts pg.TxOptions, maxClaimWait time.Duration, more func(*pgx.Batch)) (pgx.Tx, error) {
	b := &pgx.Batch{}
	b.BeginTx(opts.TxOptions)
	queueSettings(b, maxClaimWait, opts.SynchronousCommit)
	if more != nil {
		more(b)
	}
	br := pool.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		pg.Rollback(ctx, tx)
		return nil, fmt.Errorf("claimtx: begin: %w", err)
	}
	return tx, nil
}

// Step runs, in one round trip in the group transaction tx, a later
// message's step: lockWait as the lock_timeout of the rest of tx when
// positive; a savepoint, nested in the one before (a rolled-back step
// keeps its own, so each ROLLBACK TO reaches the current step's); the memo
// lookup when withMemo and the claim r as in Begin, unless r is nil (a
// natural key), bounded by the transaction's lock_timeout, not by
// r.MaxClaimWait. On error the caller rolls back to the savepoint
// (pg.SavepointRollback) or, when that fails, ends tx.
func (s *Statements) Step(ctx context.Context, tx pgx.Tx, r *pg.ClaimRequest, look pg.Lookups, lockWait time.Duration) (pg.ClaimResult, pg.Found, error) {
	var res pg.ClaimResult
	b := &pgx.Batch{}
	if lockWait > 0 {
		b.Queue(setLockTimeout, pg.Millis(lockWait))
	}
	b.Queue("SAVEPOINT claimtx_group")
	if r == nil {
		return res, pg.Found{}, tx.SendBatch(ctx, b).Close()
	}
	var memo *pgtype.Text
	if look.Memo {
		memo = s.queueMemo(b, r.Consumer, r.Key)
	}
	claim := *r
	claim.MaxClaimWait = 0 // the transaction's lock_timeout holds
	q := s.prepare(claim, &res)
	parked := s.queueParked(&q, r.Consumer, look.OrderKey)
	q.queue(b, "", nil)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return res, pg.Found{}, q.wrap(err)
	}
	if err := s.checkFingerprint(ctx, tx, q, &res); err != nil {
		return res, pg.Found{}, err
	}
	return res, foundOf(memo, parked), nil
}

// queueMemo queues the memo lookup of (consumer, key); Valid on the result
// says a memo was found.
func (s *Statements) queueMemo(b *pgx.Batch, consumer, key string) *pgtype.Text {
	m := &pgtype.Text{}
	b.Queue(s.memo, consumer, key).QueryRow(func(row pgx.Row) error {
		if err := row.Scan(m); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("claimtx: read poison memo: %w", err)
		}
		return nil
	})
	return m
}

// query is one claim statement with its arguments, ready to queue.
type query struct {
	sql   string
	args  []any
	r     pg.ClaimRequest
	shape shape
	day   pgtype.Date // when shape.eventDay
	res   *pg.ClaimResult
	// before, when set, is queued just before the claim, under its
	// lock_timeout; settings, when set, replaces both before and the
	// statement that sets a positive lock_timeout.
	before   func(*pgx.Batch)
	settings func(b *pgx.Batch, wait time.Duration, synchronousCommit string)
}

func (s *Statements) prepare(r pg.ClaimRequest, res *pg.ClaimResult) query {
	q := query{args: []any{r.Consumer, r.Key}, r: r, res: res}
	q.shape = shape{eventDay: !r.EventTime.IsZero(), payloadHash: r.PayloadHash != nil}
	if q.shape.eventDay {
		q.day = pgtype.Date{Time: pg.EventDay(r.EventTime), Valid: true}
		q.args = append(q.args, q.day)
	}
	if q.shape.payloadHash {
		q.args = append(q.args, r.PayloadHash)
	}
	q.sql = s.insert[q.shape]
	return q
}

// queue adds the claim to b, and more after it, under the request's
// lock_timeout (queueBounded).
func (q query) queue(b *pgx.Batch, synchronousCommit string, more func(*pgx.Batch)) {
	claim := func() {
		b.Queue(q.sql, q.args...).Exec(func(tag pgconn.CommandTag) error {
			q.res.New = tag.RowsAffected() == 1
			return nil
		})
		if more != nil {
			more(b)
		}
	}
	if wait := q.r.MaxClaimWait; q.settings != nil && wait > 0 {
		q.settings(b, wait, synchronousCommit)
		claim()
		b.Queue(resetLockTimeout)
		return
	}
	queueBounded(b, q.r.MaxClaimWait, synchronousCommit, func() {
		if q.before != nil {
			q.before(b)
		}
		claim()
	})
}

// queueBounded queues what queue adds to b between setting lock_timeout
// to wait (when positive) and resetting it, so the timeout bounds those
// statements only, not the effects after them. synchronousCommit, when not
// "", is set with it and not reset: COMMIT is what it is for.
func queueBounded(b *pgx.Batch, wait time.Duration, synchronousCommit string, queue func()) {
	bounded := queueSettings(b, wait, synchronousCommit)
	queue()
	if bounded {
		b.Queue(resetLockTimeout)
	}
}

// The statements of queueSettings: one whatever it sets, none when unset.
const (
	setLockTimeout     = "SELECT set_config('lock_timeout', $1, true)"
	setLockTimeoutSync = "SELECT set_config('lock_timeout', $1, true), set_config('synchronous_commit', $2, true)"
	setSync            = "SELECT set_config('synchronous_commit', $1, true)"
	resetLockTimeout   = "SET LOCAL lock_timeout TO DEFAULT"
)

// queueSettings queues, for the rest of the transaction, a lock_timeout of
// wait when positive and synchronousCommit when not "", and reports
// whether it set the lock_timeout.
func queueSettings(b *pgx.Batch, wait time.Duration, synchronousCommit string) (bounded bool) {
	switch {
	case wait > 0 && synchronousCommit != "":
		b.Queue(setLockTimeoutSync, pg.Millis(wait), synchronousCommit)
	case wait > 0:
		b.Queue(setLockTimeout, pg.Millis(wait))
	case synchronousCommit != "":
		b.Queue(setSync, synchronousCommit)
	}
	return wait > 0
}

func (q query) wrap(err error) error {
	if q.shape.eventDay {
		return eventDayClaimError(q.day.Time, err)
	}
	return fmt.Errorf("claimtx: claim: %w", err)
}

// checkFingerprint compares a duplicate's stored payload hash with r's.
func (s *Statements) checkFingerprint(ctx context.Context, tx pgx.Tx, q query, res *pg.ClaimResult) error {
	if res.New || q.r.PayloadHash == nil {
		return nil
	}
	sql, hargs := s.hash, []any{q.r.Consumer, q.r.Key}
	if q.shape.eventDay {
		sql, hargs = s.hashByDay, append(hargs, q.day)
	}
	var stored []byte
	if err := tx.QueryRow(ctx, sql, hargs...).Scan(&stored); err != nil {
		return fmt.Errorf("claimtx: read claim fingerprint: %w", err)
	}
	res.FingerprintMismatch = stored != nil && !bytes.Equal(stored, q.r.PayloadHash)
	return nil
}

// eventDayClaimError explains the two ways a claim by event day fails for
// the table's shape.
func eventDayClaimError(day time.Time, err error) error {
	switch pg.SQLState(err) {
	case "23514": // check_violation: no partition for the key, or the legacy boundary
		return fmt.Errorf("claimtx: claim at event day %s: %w: %w", day.Format(time.DateOnly), ErrNoPartition, err)
	case "42703": // undefined_column
		return fmt.Errorf("claimtx: claim at event day %s: the claim table has no event_day column (run PreparePartitioning or `claimtx partitions enable`): %w", day.Format(time.DateOnly), err)
	}
	return fmt.Errorf("claimtx: claim: %w", err)
}
