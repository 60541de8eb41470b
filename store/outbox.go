package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store/internal/outboxsql"
)

// IdempotencyKeyMetadata is the metadata key every relayed message carries:
// the outbox row's idempotency key, identical on every resend, for
// consumers to key on ("metadata:claimtx_idempotency_key") and HTTP
// effects to pass as Idempotency-Key. A message enqueued with it set keeps
// it (say "receipt:order-9912", to deduplicate an event enqueued twice);
// otherwise Enqueue assigns a random UUID.
const IdempotencyKeyMetadata = outboxsql.IdempotencyKeyMetadata

// ErrInvalidOutboxMessage is matched by every (permanent) error Enqueue
// returns for a message it refuses: an empty topic or one over 255 bytes,
// a nil message, metadata that Postgres jsonb cannot store.
var ErrInvalidOutboxMessage = errors.New("claimtx: invalid outbox message")

// OutboxStats describes the outbox table.
type OutboxStats struct {
	Pending int64 // not published yet
	Sent    int64 // published, kept until cleanup deletes them
	// OldestPending is the age of the oldest pending row (0 when none):
	// the relay's lag. Alert on it.
	OldestPending time.Duration
	Failing       int64 // pending rows with at least one failed publish
}

// Enqueue writes msgs to the outbox in tx, addressed to topic: a relay
// (package store/outbox) publishes them once tx commits, never if it rolls
// back. Each message keeps its UUID (assigned when empty), payload and
// metadata. It also notifies relays (pg_notify at commit, which Postgres
// serialises per database: it matters at thousands of commits a second).
func (s *Store) Enqueue(ctx context.Context, tx pgx.Tx, topic string, msgs ...*message.Message) error {
	if tx == nil {
		return errors.New("claimtx: Enqueue needs a transaction")
	}
	if len(msgs) == 0 {
		return nil
	}
	if err := validateTopic(topic); err != nil {
		return framework.Permanent(fmt.Errorf("%w: %s", ErrInvalidOutboxMessage, err.Error()))
	}
	var (
		uuids    = make([]string, len(msgs))
		keys     = make([]string, len(msgs))
		payloads = make([][]byte, len(msgs))
		metas    = make([]string, len(msgs))
	)
	for i, m := range msgs {
		if err := validateOutboxMessage(m); err != nil {
			return framework.Permanent(fmt.Errorf("%w %d: %s", ErrInvalidOutboxMessage, i, err.Error()))
		}
		uuids[i] = m.UUID
		if uuids[i] == "" {
			uuids[i] = watermill.NewUUID()
		}
		keys[i] = m.Metadata.Get(IdempotencyKeyMetadata)
		if keys[i] == "" {
			keys[i] = watermill.NewUUID()
		}
		md := maps.Collect(maps.All(m.Metadata)) // never nil: "{}", not "null"
		delete(md, IdempotencyKeyMetadata)
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
	if err := s.outbox.Insert(ctx, tx, topic, uuids, keys, payloads, metas); err != nil {
		return fmt.Errorf("claimtx: enqueue %d outbox message(s): %w", len(msgs), err)
	}
	return nil
}

// validateTopic refuses what no broker accepts or Postgres would refuse
// later with a less helpful error.
func validateTopic(topic string) error {
	switch {
	case topic == "":
		return errors.New("topic is empty")
	case len(topic) > pg.MaxOutboxTopicBytes:
		return fmt.Errorf("topic is %d bytes, longer than %d", len(topic), pg.MaxOutboxTopicBytes)
	case !pg.Storable(topic):
		return errors.New("topic must be valid UTF-8 without NUL bytes")
	}
	return nil
}

// validateOutboxMessage refuses what jsonb cannot hold (NUL, invalid
// UTF-8, which json.Marshal would silently replace).
func validateOutboxMessage(m *message.Message) error {
	switch {
	case m == nil:
		return errors.New("message is nil")
	case !pg.Storable(m.UUID):
		return errors.New("UUID must be valid UTF-8 without NUL bytes")
	}
	for k, v := range m.Metadata {
		if !pg.Storable(k) || !pg.Storable(v) {
			return fmt.Errorf("metadata %q: keys and values must be valid UTF-8 without NUL bytes", strings.ToValidUTF8(k, "?"))
		}
	}
	return nil
}

// OutboxStats counts the outbox's rows. It scans the table: not per message.
func (s *Store) OutboxStats(ctx context.Context) (OutboxStats, error) {
	var st OutboxStats
	var oldest float64
	if err := s.outbox.Stats(ctx, s.pool).Scan(&st.Pending, &st.Sent, &oldest, &st.Failing); err != nil {
		return OutboxStats{}, fmt.Errorf("claimtx: outbox stats: %w", err)
	}
	st.OldestPending = time.Duration(oldest * float64(time.Second))
	return st, nil
}
