// Package outboxsql holds the outbox statements: the insert behind
// Store.Enqueue and what the relay (store/outbox) runs.
package outboxsql

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/pg"
)

// IdempotencyKeyMetadata is store.IdempotencyKeyMetadata (see there).
const IdempotencyKeyMetadata = "claimtx_idempotency_key"

// Row is a pending outbox row as a relay locks it.
type Row struct {
	ID             int64
	Topic          string
	UUID           string
	IdempotencyKey string
	Payload        []byte
	Metadata       map[string]string
	Attempts       int // earlier failed publishes of this row
	CreatedAt      time.Time
}

// Message returns a new Watermill message to publish: the stored UUID,
// payload and metadata, plus IdempotencyKeyMetadata.
func (r Row) Message() *message.Message {
	msg := message.NewMessage(r.UUID, r.Payload)
	for k, v := range r.Metadata {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set(IdempotencyKeyMetadata, r.IdempotencyKey)
	return msg
}

// Statements are the statements of one outbox table, rendered once.
type Statements struct {
	insert, lock, markSent, markFailed, deleteSent, stats string
	notifyPayload                                         string
}

// For returns the statements of the outbox table outbox in schema.
func For(schema, outbox string) *Statements {
	n := pg.NewNames(schema, "", outbox)
	return &Statements{
		insert: n.Render(`INSERT INTO {schema}.{outbox} (topic, uuid, idempotency_key, payload, metadata)
SELECT $1, u, k, p, m::jsonb
FROM unnest($2::text[], $3::text[], $4::bytea[], $5::text[]) WITH ORDINALITY AS x(u, k, p, m, n)
ORDER BY n`),
		lock: n.Render(`SELECT id, topic, uuid, idempotency_key, payload, metadata, attempts, created_at
FROM {schema}.{outbox}
WHERE sent_at IS NULL
ORDER BY id
LIMIT $1
FOR UPDATE SKIP LOCKED`),
		markSent:   n.Render(`UPDATE {schema}.{outbox} SET sent_at = now() WHERE id = ANY($1) AND sent_at IS NULL`),
		markFailed: n.Render(`UPDATE {schema}.{outbox} SET attempts = attempts + 1, last_error = $2 WHERE id = ANY($1) AND sent_at IS NULL`),
		deleteSent: n.Render(`DELETE FROM {schema}.{outbox} WHERE id IN (
    SELECT id FROM {schema}.{outbox}
    WHERE sent_at < now() - $1 * interval '1 millisecond'
    ORDER BY sent_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)`),
		stats: n.Render(`SELECT count(*) FILTER (WHERE sent_at IS NULL),
       count(*) FILTER (WHERE sent_at IS NOT NULL),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE sent_at IS NULL)), 0)::float8,
       count(*) FILTER (WHERE sent_at IS NULL AND attempts > 0)
FROM {schema}.{outbox}`),
		notifyPayload: pg.OutboxPayload(schema, outbox),
	}
}

// Insert writes rows for topic to the outbox in tx, one element of each
// slice per row, and notifies the relays at commit, in one round trip.
func (s *Statements) Insert(ctx context.Context, tx pgx.Tx, topic string, uuids, keys []string, payloads [][]byte, metadata []string) error {
	b := &pgx.Batch{}
	b.Queue(s.insert, topic, uuids, keys, payloads, metadata)
	b.Queue("SELECT pg_notify($1, $2)", pg.OutboxChannel, s.notifyPayload)
	return tx.SendBatch(ctx, b).Close()
}

// LockPending locks up to limit pending rows, oldest first, in tx and
// returns them, skipping rows another relay holds (FOR UPDATE SKIP
// LOCKED). Publish them, MarkSent them, commit; a relay that dies first
// loses its locks with its connection: published at least once.
func (s *Statements) LockPending(ctx context.Context, tx pgx.Tx, limit int) ([]Row, error) {
	if tx == nil {
		return nil, errors.New("claimtx: locking outbox rows needs a transaction")
	}
	if limit <= 0 {
		return nil, fmt.Errorf("claimtx: outbox row limit %d must be positive", limit)
	}
	rows, err := tx.Query(ctx, s.lock, limit)
	var out []Row
	if err == nil {
		out, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Row]) // the columns in field order
	}
	return out, pg.Wrap(err, "claimtx: lock pending outbox rows")
}

// MarkSent records in tx that the rows were published.
func (s *Statements) MarkSent(ctx context.Context, tx pgx.Tx, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, s.markSent, ids); err != nil {
		return fmt.Errorf("claimtx: mark %d outbox row(s) sent: %w", len(ids), err)
	}
	return nil
}

// MarkFailed records a failed publish of the rows (attempts + 1 and the
// error text); they stay pending.
func (s *Statements) MarkFailed(ctx context.Context, tx pgx.Tx, ids []int64, cause error) error {
	if len(ids) == 0 {
		return nil
	}
	text := "unknown error"
	if cause != nil {
		text = strings.ToValidUTF8(strings.ReplaceAll(cause.Error(), "\x00", ""), "?")
	}
	_, err := tx.Exec(ctx, s.markFailed, ids, text)
	return pg.Wrap(err, "claimtx: record outbox failure")
}

// DeleteSent deletes up to limit rows sent more than olderThan ago
// (database clock), skipping rows a concurrent cleanup holds, and returns
// how many it deleted: call it until it returns less than limit.
func (s *Statements) DeleteSent(ctx context.Context, db pg.Execer, olderThan time.Duration, limit int) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("claimtx: outbox cleanup limit %d must be positive", limit)
	}
	tag, err := db.Exec(ctx, s.deleteSent, max(olderThan, 0).Milliseconds(), limit)
	return tag.RowsAffected(), pg.Wrap(err, "claimtx: delete sent outbox rows")
}

// Stats queries the outbox's counts for store.Store.OutboxStats: pending,
// sent, the oldest pending row's age in seconds, failing.
func (s *Statements) Stats(ctx context.Context, db pg.Querier) pgx.Row {
	return db.QueryRow(ctx, s.stats)
}
