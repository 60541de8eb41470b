package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/outboxnotify"
)

// IdempotencyKeyMetadata is the metadata key every relayed message carries:
// the outbox row's idempotency key, identical on every resend of that row.
// Downstream claimtx consumers key on it ("metadata:claimtx_idempotency_key")
// so the relay's own at-least-once resends are recorded as duplicates, and
// HTTP effects pass it on as the provider's Idempotency-Key.
//
// A message enqueued with this key already set keeps it: derive it from the
// event (say "receipt:order-9912") when the downstream effect must stay
// deduplicated even if the same event were enqueued twice. Otherwise
// Enqueue assigns a random UUID, stored with the row.
const IdempotencyKeyMetadata = "claimtx_idempotency_key"

// OutboxChannel is the LISTEN/NOTIFY channel Enqueue notifies on commit,
// with the outbox's "schema.table" as payload, so relays wake at once
// instead of waiting for their next poll.
const OutboxChannel = "claimtx_outbox"

// MaxTopicBytes bounds outbox topic names. Brokers have their own limits
// (RabbitMQ queue names: 255 bytes; Kafka topics: 249).
const MaxTopicBytes = 255

// ErrInvalidOutboxMessage is matched by every error Enqueue returns for a
// message it refuses (empty or over-long topic, nil message, metadata that
// Postgres jsonb cannot store). Such errors are permanent: the same handler
// run on the same message produces the same outbox message again.
var ErrInvalidOutboxMessage = errors.New("claimtx: invalid outbox message")

// OutboxMessage is a message addressed to a topic, for EnqueueMessages.
type OutboxMessage struct {
	Topic   string
	Message *message.Message
}

// OutboxRow is a pending outbox row as a relay claims it.
type OutboxRow struct {
	ID             int64
	Topic          string
	UUID           string
	IdempotencyKey string
	Payload        []byte
	Metadata       map[string]string
	// Attempts counts earlier failed publishes of this row.
	Attempts  int
	CreatedAt time.Time
}

// Message returns the Watermill message to publish: the stored UUID,
// payload and metadata, plus IdempotencyKeyMetadata. Each call returns a new
// message, as Watermill wants one per Publish.
func (r OutboxRow) Message() *message.Message {
	msg := message.NewMessage(r.UUID, r.Payload)
	for k, v := range r.Metadata {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set(IdempotencyKeyMetadata, r.IdempotencyKey)
	return msg
}

// OutboxStats describes the outbox table.
type OutboxStats struct {
	// Pending rows are not published yet.
	Pending int64
	// Sent rows are published and kept until cleanup deletes them.
	Sent int64
	// OldestPending is the age of the oldest pending row (0 when none):
	// the relay's lag. Alert on it.
	OldestPending time.Duration
	// Failing counts pending rows with at least one failed publish.
	Failing int64
}

type outboxSQL struct {
	insert, notify, claim, markSent, markFailed, deleteSent, stats string
	notifyPayload                                                  string
}

func (s *Store) initOutboxSQL() {
	s.outbox = outboxSQL{
		insert: s.render(`INSERT INTO {schema}.{outbox} (topic, uuid, idempotency_key, payload, metadata)
SELECT t, u, k, p, m::jsonb
FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[]) WITH ORDINALITY AS x(t, u, k, p, m, n)
ORDER BY n`),
		notify: "SELECT pg_notify($1, $2)",
		claim: s.render(`SELECT id, topic, uuid, idempotency_key, payload, metadata, attempts, created_at
FROM {schema}.{outbox}
WHERE sent_at IS NULL
ORDER BY id
LIMIT $1
FOR UPDATE SKIP LOCKED`),
		markSent:   s.render(`UPDATE {schema}.{outbox} SET sent_at = now() WHERE id = ANY($1) AND sent_at IS NULL`),
		markFailed: s.render(`UPDATE {schema}.{outbox} SET attempts = attempts + 1, last_error = $2 WHERE id = ANY($1) AND sent_at IS NULL`),
		deleteSent: s.render(`DELETE FROM {schema}.{outbox} WHERE id IN (
    SELECT id FROM {schema}.{outbox}
    WHERE sent_at < now() - $1 * interval '1 millisecond'
    ORDER BY sent_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)`),
		stats: s.render(`SELECT count(*) FILTER (WHERE sent_at IS NULL),
       count(*) FILTER (WHERE sent_at IS NOT NULL),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE sent_at IS NULL)), 0)::float8,
       count(*) FILTER (WHERE sent_at IS NULL AND attempts > 0)
FROM {schema}.{outbox}`),
		// Relays of other schemas listening on the same database ignore
		// notifications whose payload is not theirs.
		notifyPayload: outboxnotify.Payload(s.cfg.Schema, s.cfg.OutboxTable),
	}
}

// Enqueue writes msgs to the outbox in tx, addressed to topic. They are
// published by a relay (package store/outbox) only after tx commits, and
// never if it rolls back: so a message exists if and only if the effect
// that produced it committed. Call it from a handler under the claim
// middleware with the claim transaction (framework.TxFromContext), or from
// any transaction of your own.
//
// Each message keeps its UUID (a new one is assigned when empty), payload
// and metadata. Its IdempotencyKeyMetadata value, when set, becomes the
// row's idempotency key; otherwise a random UUID does.
//
// Enqueue also notifies relays (pg_notify, delivered at commit). Postgres
// serialises the commits of notifying transactions in a database, which
// matters only at thousands of enqueuing commits per second; relays also
// poll.
func (s *Store) Enqueue(ctx context.Context, tx pgx.Tx, topic string, msgs ...*message.Message) error {
	out := make([]OutboxMessage, len(msgs))
	for i, m := range msgs {
		out[i] = OutboxMessage{Topic: topic, Message: m}
	}
	return s.EnqueueMessages(ctx, tx, out...)
}

// EnqueueMessages is Enqueue for messages addressed to different topics,
// written in one statement.
func (s *Store) EnqueueMessages(ctx context.Context, tx pgx.Tx, msgs ...OutboxMessage) error {
	if tx == nil {
		return errors.New("claimtx: Enqueue needs a transaction")
	}
	if len(msgs) == 0 {
		return nil
	}
	var (
		topics   = make([]string, len(msgs))
		uuids    = make([]string, len(msgs))
		keys     = make([]string, len(msgs))
		payloads = make([][]byte, len(msgs))
		metas    = make([]string, len(msgs))
	)
	for i, om := range msgs {
		if err := validateOutboxMessage(om); err != nil {
			return framework.Permanent(fmt.Errorf("%w %d: %s", ErrInvalidOutboxMessage, i, err.Error()))
		}
		m := om.Message
		topics[i] = om.Topic
		uuids[i] = m.UUID
		if uuids[i] == "" {
			uuids[i] = watermill.NewUUID()
		}
		keys[i] = m.Metadata.Get(IdempotencyKeyMetadata)
		if keys[i] == "" {
			keys[i] = watermill.NewUUID()
		}
		md := make(map[string]string, len(m.Metadata))
		for k, v := range m.Metadata {
			if k != IdempotencyKeyMetadata {
				md[k] = v
			}
		}
		js, err := json.Marshal(md)
		if err != nil {
			return framework.Permanent(fmt.Errorf("%w %d: metadata: %w", ErrInvalidOutboxMessage, i, err))
		}
		metas[i] = string(js)
		payloads[i] = m.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{} // the column is NOT NULL; an empty payload is a payload
		}
	}
	b := &pgx.Batch{}
	b.Queue(s.outbox.insert, topics, uuids, keys, payloads, metas)
	b.Queue(s.outbox.notify, OutboxChannel, s.outbox.notifyPayload)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("claimtx: enqueue %d outbox message(s): %w", len(msgs), err)
	}
	return nil
}

// validateOutboxMessage refuses what Postgres would refuse later with a
// less helpful error (jsonb cannot hold NUL or invalid UTF-8; json.Marshal
// would silently replace the latter) and what no broker accepts.
func validateOutboxMessage(om OutboxMessage) error {
	switch {
	case om.Message == nil:
		return errors.New("message is nil")
	case om.Topic == "":
		return errors.New("topic is empty")
	case len(om.Topic) > MaxTopicBytes:
		return fmt.Errorf("topic is %d bytes, longer than %d", len(om.Topic), MaxTopicBytes)
	case !cleanText(om.Topic):
		return errors.New("topic must be valid UTF-8 without NUL bytes")
	case !cleanText(om.Message.UUID):
		return errors.New("UUID must be valid UTF-8 without NUL bytes")
	}
	for k, v := range om.Message.Metadata {
		if !cleanText(k) || !cleanText(v) {
			return fmt.Errorf("metadata %q: keys and values must be valid UTF-8 without NUL bytes", strings.ToValidUTF8(k, "?"))
		}
	}
	return nil
}

func cleanText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// ClaimOutbox locks up to limit pending rows, oldest first, in tx and
// returns them. Rows locked by another transaction (another relay) are
// skipped, not waited for (FOR UPDATE SKIP LOCKED), so several relays share
// the backlog and never hold the same row at once. The locks last until tx
// ends: publish the rows, MarkOutboxSent them, commit. If the relay dies
// first, the locks vanish with its connection and the rows are claimed
// again: published at least once.
func (s *Store) ClaimOutbox(ctx context.Context, tx pgx.Tx, limit int) ([]OutboxRow, error) {
	if tx == nil {
		return nil, errors.New("claimtx: ClaimOutbox needs a transaction")
	}
	if limit <= 0 {
		return nil, fmt.Errorf("claimtx: ClaimOutbox limit %d must be positive", limit)
	}
	rows, err := tx.Query(ctx, s.outbox.claim, limit)
	if err != nil {
		return nil, fmt.Errorf("claimtx: claim outbox rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (OutboxRow, error) {
		var r OutboxRow
		err := row.Scan(&r.ID, &r.Topic, &r.UUID, &r.IdempotencyKey, &r.Payload, &r.Metadata, &r.Attempts, &r.CreatedAt)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("claimtx: claim outbox rows: %w", err)
	}
	return out, nil
}

// MarkOutboxSent records in tx that the rows were published. Call it only
// after Publish returned nil for every one of them.
func (s *Store) MarkOutboxSent(ctx context.Context, tx pgx.Tx, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, s.outbox.markSent, ids); err != nil {
		return fmt.Errorf("claimtx: mark %d outbox row(s) sent: %w", len(ids), err)
	}
	return nil
}

// MarkOutboxFailed records a failed publish of the rows (attempts + 1 and
// the error text); they stay pending.
func (s *Store) MarkOutboxFailed(ctx context.Context, tx pgx.Tx, ids []int64, cause error) error {
	if len(ids) == 0 {
		return nil
	}
	text := "unknown error"
	if cause != nil {
		text = strings.ToValidUTF8(strings.ReplaceAll(cause.Error(), "\x00", ""), "?")
	}
	if _, err := tx.Exec(ctx, s.outbox.markFailed, ids, text); err != nil {
		return fmt.Errorf("claimtx: record outbox failure: %w", err)
	}
	return nil
}

// DeleteSentOutbox deletes up to limit rows sent more than olderThan ago
// (by the database's clock) and returns how many it deleted. Rows locked by
// a concurrent cleanup are skipped, so cleanups running in several relays
// do not wait on each other. Call it repeatedly until it returns less than
// limit; small batches keep locks and WAL bursts short.
func (s *Store) DeleteSentOutbox(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("claimtx: DeleteSentOutbox limit %d must be positive", limit)
	}
	if olderThan < 0 {
		olderThan = 0
	}
	tag, err := s.pool.Exec(ctx, s.outbox.deleteSent, olderThan.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("claimtx: delete sent outbox rows: %w", err)
	}
	return tag.RowsAffected(), nil
}

// OutboxStats counts the outbox's rows. It scans the table: call it from
// health checks and tests, not per message.
func (s *Store) OutboxStats(ctx context.Context) (OutboxStats, error) {
	var st OutboxStats
	var oldest float64
	if err := s.pool.QueryRow(ctx, s.outbox.stats).Scan(&st.Pending, &st.Sent, &oldest, &st.Failing); err != nil {
		return OutboxStats{}, fmt.Errorf("claimtx: outbox stats: %w", err)
	}
	st.OldestPending = time.Duration(oldest * float64(time.Second))
	return st, nil
}
