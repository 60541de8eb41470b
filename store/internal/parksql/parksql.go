// Package parksql holds the statements of ordered effects' parking
// (middleware.Claim.OrderKey, migration 009): the parked messages of an
// order key, in delivery order, and the key row that is its lock.
package parksql

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
	"github.com/claimtx/claimtx/store/internal/poisonsql"
)

// Statements are the parking statements of one claim table, rendered once.
type Statements struct {
	pool *pgxpool.Pool

	unclaim, insert, lockKey, applied  string
	due, lockForRelease, head, deleteM string
	deleteKey, failed, failedHead      string
	clearSkip                          string
	keys, key, messages, request       string
	stats                              string
}

// For renders the statements of n's parking tables, run on pool.
func For(pool *pgxpool.Pool, n *pg.Names) *Statements {
	const keyCols = `k.consumer, k.order_key, k.reason, k.parked_at, k.failures, k.retry_at, k.skip_head,
	coalesce(k.requested_by, ''), coalesce(k.request_note, ''),
	(SELECT count(*) FROM {schema}.{parked} p WHERE p.consumer = k.consumer AND p.order_key = k.order_key)`
	const msgCols = `id, consumer, order_key, message_key, uuid, payload, metadata::text, coalesce(reason, ''), parked_at`
	return &Statements{
		pool:    pool,
		unclaim: n.Render("DELETE FROM {schema}.{claims} WHERE consumer = $1 AND message_key = $2"),
		insert: n.Render(`INSERT INTO {schema}.{parked} (consumer, order_key, message_key, uuid, payload, metadata, reason)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, NULLIF($7, '')) ON CONFLICT (consumer, message_key) DO NOTHING`),
		// DO UPDATE, not NOTHING: the row must be locked either way.
		lockKey: n.Render(`INSERT INTO {schema}.{parked_keys} AS k (consumer, order_key, reason, retry_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, order_key) DO UPDATE SET reason = k.reason`),
		applied:        n.Render("SELECT EXISTS (SELECT 1 FROM {schema}.{claims} WHERE consumer = $1 AND message_key = $2)"),
		due:            n.Render("SELECT order_key FROM {schema}.{parked_keys} WHERE consumer = $1 AND retry_at <= now() ORDER BY retry_at LIMIT $2"),
		lockForRelease: n.Render("SELECT " + keyCols + " FROM {schema}.{parked_keys} k WHERE k.consumer = $1 AND k.order_key = $2 FOR UPDATE OF k SKIP LOCKED"),
		head:           n.Render("SELECT " + msgCols + " FROM {schema}.{parked} WHERE consumer = $1 AND order_key = $2 ORDER BY id LIMIT 1"),
		deleteM:        n.Render("DELETE FROM {schema}.{parked} WHERE id = $1"),
		deleteKey:      n.Render("DELETE FROM {schema}.{parked_keys} WHERE consumer = $1 AND order_key = $2"),
		failed: n.Render(`UPDATE {schema}.{parked_keys} SET reason = $3, failures = failures + 1, retry_at = $4,
	skip_head = false, requested_by = NULL, request_note = NULL WHERE consumer = $1 AND order_key = $2`),
		clearSkip:  n.Render("UPDATE {schema}.{parked_keys} SET skip_head = false WHERE consumer = $1 AND order_key = $2"),
		failedHead: n.Render("UPDATE {schema}.{parked} SET reason = $3 WHERE consumer = $1 AND message_key = $2"),
		keys:       n.Render("SELECT " + keyCols + " FROM {schema}.{parked_keys} k WHERE k.consumer = $1 OR $1 = '' ORDER BY k.parked_at, k.order_key LIMIT $2"),
		key:        n.Render("SELECT " + keyCols + " FROM {schema}.{parked_keys} k WHERE k.consumer = $1 AND k.order_key = $2"),
		messages:   n.Render("SELECT " + msgCols + " FROM {schema}.{parked} WHERE consumer = $1 AND order_key = $2 ORDER BY id LIMIT $3"),
		request: n.Render(`UPDATE {schema}.{parked_keys} SET retry_at = now(), skip_head = $3, requested_by = NULLIF($4, ''), request_note = NULLIF($5, '')
WHERE consumer = $1 AND order_key = $2`),
		stats: n.Render(`SELECT k.consumer, count(*), sum((SELECT count(*) FROM {schema}.{parked} p WHERE p.consumer = k.consumer AND p.order_key = k.order_key)), min(k.parked_at)
FROM {schema}.{parked_keys} k GROUP BY k.consumer ORDER BY k.consumer`),
	}
}

// queueInsert queues the insert of m, unless a copy of it is parked.
func (s *Statements) queueInsert(b *pgx.Batch, m pg.ParkedMessage) error {
	md, err := poisonsql.EncodeMetadata(m.Metadata)
	if err != nil {
		return fmt.Errorf("claimtx: park: %w", err)
	}
	payload := m.Payload
	if payload == nil {
		payload = []byte{}
	}
	b.Queue(s.insert, m.Consumer, m.OrderKey, m.Key, pg.Text(m.UUID), payload, string(md), poison.StoredReason(m.Reason))
	return nil
}

// ParkBehind parks ms, in order, whose order keys the claim transaction
// tx found parked (holding their rows FOR SHARE), and undoes their new
// claims in tx, all in one round trip: none is applied until its key is
// released. The caller commits tx.
func (s *Statements) ParkBehind(ctx context.Context, tx pgx.Tx, ms ...pg.ParkedMessage) error {
	b := &pgx.Batch{}
	for _, m := range ms {
		b.Queue(s.unclaim, m.Consumer, m.Key)
		if err := s.queueInsert(b, m); err != nil {
			return err
		}
	}
	return pg.Wrap(tx.SendBatch(ctx, b).Close(), "claimtx: park behind the parked order key")
}

// ParkHead parks m, which failed for good (m.Reason), as its key's head in
// a transaction of its own: the key row first (the lock a claim of the key
// reads), then m, unless m's claim is committed (a twin applied it: parked
// is false and nothing is written). retryAt is the key's first automatic
// release, nil for none. A copy of m parked before is not parked twice.
func (s *Statements) ParkHead(ctx context.Context, m pg.ParkedMessage, retryAt *time.Time) (parked bool, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(s.lockKey, m.Consumer, m.OrderKey, poison.StoredReason(m.Reason), retryAt)
		var applied bool
		b.Queue(s.applied, m.Consumer, m.Key).QueryRow(func(row pgx.Row) error { return row.Scan(&applied) })
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if applied {
			return errApplied
		}
		b = &pgx.Batch{}
		if err := s.queueInsert(b, m); err != nil {
			return err
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if errors.Is(err, errApplied) {
		return false, nil
	}
	return err == nil, pg.Wrap(err, "claimtx: park")
}

var errApplied = errors.New("applied")

// Due returns up to limit of consumer's order keys whose release is due.
func (s *Statements) Due(ctx context.Context, consumer string, limit int) ([]string, error) {
	rows, err := s.pool.Query(ctx, s.due, consumer, limit)
	if err != nil {
		return nil, pg.Wrap(err, "claimtx: parked keys due")
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return keys, pg.Wrap(err, "claimtx: parked keys due")
}

// BeginRelease begins one step of a release of (consumer, orderKey): it
// locks the key row (nil when it is gone or another release holds it) and
// reads the head. Without a head the key row is deleted and the
// transaction committed: the key is released. Else the caller applies the
// head in r.Tx and calls Released, or rolls back.
func (s *Statements) BeginRelease(ctx context.Context, opts pg.TxOptions, consumer, orderKey string) (*pg.Release, error) {
	tx, err := s.pool.BeginTx(ctx, opts.TxOptions)
	if err != nil {
		return nil, pg.Wrap(err, "claimtx: release: begin")
	}
	r, err := s.beginRelease(ctx, tx, opts, consumer, orderKey)
	if err != nil || r == nil || r.Head == nil {
		pg.Rollback(ctx, tx) // a no-op once committed
	}
	return r, err
}

func (s *Statements) beginRelease(ctx context.Context, tx pgx.Tx, opts pg.TxOptions, consumer, orderKey string) (*pg.Release, error) {
	if opts.SynchronousCommit != "" {
		if _, err := tx.Exec(ctx, "SELECT set_config('synchronous_commit', $1, true)", opts.SynchronousCommit); err != nil {
			return nil, pg.Wrap(err, "claimtx: release")
		}
	}
	r := &pg.Release{Tx: tx}
	if err := scanKey(tx.QueryRow(ctx, s.lockForRelease, consumer, orderKey), &r.Key); errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	} else if err != nil {
		return nil, pg.Wrap(err, "claimtx: release: lock the parked key")
	}
	rows, err := tx.Query(ctx, s.head, consumer, orderKey)
	if err != nil {
		return nil, pg.Wrap(err, "claimtx: release: read the head")
	}
	heads, err := pgx.CollectRows(rows, scanMessage)
	if err != nil {
		return nil, pg.Wrap(err, "claimtx: release: read the head")
	}
	if len(heads) == 1 {
		r.Head = &heads[0]
		return r, nil
	}
	if _, err := tx.Exec(ctx, s.deleteKey, consumer, orderKey); err != nil {
		return nil, pg.Wrap(err, "claimtx: release: delete the key")
	}
	return r, pg.Wrap(tx.Commit(ctx), "claimtx: release: commit")
}

// Released deletes r's head in r.Tx (applied, a duplicate or skipped) and
// clears a skip request, then commits.
func (s *Statements) Released(ctx context.Context, r *pg.Release) error {
	b := &pgx.Batch{}
	b.Queue(s.deleteM, r.Head.ID)
	if r.Key.SkipHead {
		b.Queue(s.clearSkip, r.Key.Consumer, r.Key.OrderKey)
	}
	if err := r.Tx.SendBatch(ctx, b).Close(); err != nil {
		return pg.Wrap(err, "claimtx: release")
	}
	return pg.Wrap(r.Tx.Commit(ctx), "claimtx: release: commit")
}

// ReleaseFailed records that the head (headKey) of a release failed again
// with reason: the key stays parked, its request cleared, and the next
// automatic release is retryAt (nil: none).
func (s *Statements) ReleaseFailed(ctx context.Context, consumer, orderKey, headKey, reason string, retryAt *time.Time) error {
	b := &pgx.Batch{}
	b.Queue(s.failed, consumer, orderKey, poison.StoredReason(reason), retryAt)
	b.Queue(s.failedHead, consumer, headKey, poison.StoredReason(reason))
	return pg.Wrap(s.pool.SendBatch(ctx, b).Close(), "claimtx: record the failed release")
}

// Keys lists up to limit parked keys, oldest first, of consumer (all
// consumers when "").
func (s *Statements) Keys(ctx context.Context, consumer string, limit int) ([]pg.ParkedKey, error) {
	rows, err := s.pool.Query(ctx, s.keys, consumer, limit)
	if err != nil {
		return nil, pg.Wrap(err, "claimtx: parked keys")
	}
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (pg.ParkedKey, error) {
		var k pg.ParkedKey
		return k, scanKey(row, &k)
	})
	return keys, pg.Wrap(err, "claimtx: parked keys")
}

// Key returns one parked key; ok is false when it is not parked.
func (s *Statements) Key(ctx context.Context, consumer, orderKey string) (k pg.ParkedKey, ok bool, err error) {
	err = scanKey(s.pool.QueryRow(ctx, s.key, consumer, orderKey), &k)
	if errors.Is(err, pgx.ErrNoRows) {
		return k, false, nil
	}
	return k, err == nil, pg.Wrap(err, "claimtx: parked key")
}

// Messages returns up to limit parked messages of a key, in order.
func (s *Statements) Messages(ctx context.Context, consumer, orderKey string, limit int) ([]pg.ParkedMessage, error) {
	rows, err := s.pool.Query(ctx, s.messages, consumer, orderKey, limit)
	if err != nil {
		return nil, pg.Wrap(err, "claimtx: parked messages")
	}
	ms, err := pgx.CollectRows(rows, scanMessage)
	return ms, pg.Wrap(err, "claimtx: parked messages")
}

// Request asks the consumers for a release of a parked key now, its head
// poisoned first when skip, recording by and note; false when the key is
// not parked.
func (s *Statements) Request(ctx context.Context, consumer, orderKey string, skip bool, by, note string) (bool, error) {
	tag, err := s.pool.Exec(ctx, s.request, consumer, orderKey, skip, pg.Text(by), poison.StoredReason(note))
	return tag.RowsAffected() == 1, pg.Wrap(err, "claimtx: request a release")
}

// Stats sums up the parked keys of every consumer.
func (s *Statements) Stats(ctx context.Context) ([]pg.ParkedStats, error) {
	rows, err := s.pool.Query(ctx, s.stats)
	if err != nil {
		return nil, pg.Wrap(err, "claimtx: parked stats")
	}
	st, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (pg.ParkedStats, error) {
		var p pg.ParkedStats
		return p, row.Scan(&p.Consumer, &p.Keys, &p.Messages, &p.Oldest)
	})
	return st, pg.Wrap(err, "claimtx: parked stats")
}

func scanKey(row pgx.Row, k *pg.ParkedKey) error {
	return row.Scan(&k.Consumer, &k.OrderKey, &k.Reason, &k.ParkedAt, &k.Failures, &k.RetryAt, &k.SkipHead, &k.RequestedBy, &k.RequestNote, &k.Messages)
}

func scanMessage(row pgx.CollectableRow) (pg.ParkedMessage, error) {
	var m pg.ParkedMessage
	var md string
	if err := row.Scan(&m.ID, &m.Consumer, &m.OrderKey, &m.Key, &m.UUID, &m.Payload, &md, &m.Reason, &m.ParkedAt); err != nil {
		return m, err
	}
	var err error
	m.Metadata, err = poisonsql.DecodeMetadata([]byte(md))
	return m, err
}
