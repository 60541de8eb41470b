package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// the outbox row's idempotency key, identical on every resend of that row.
// Downstream claimtx consumers key on it ("metadata:claimtx_idempotency_key")
// so the relay's own at-least-once resends are recorded as duplicates, and
// HTTP effects pass it on as the provider's Idempotency-Key.
//
// A message enqueued with this key already set keeps it: derive it from the
// event (say "receipt:order-9912") when the downstream effect must stay
// deduplicated even if the same event were enqueued twice. Otherwise
// Enqueue assigns a random UUID, stored with the row.
const IdempotencyKeyMetadata = outboxsql.IdempotencyKeyMetadata

// ErrInvalidOutboxMessage is matched by every error Enqueue returns for a
// message it refuses (empty topic or one over 255 bytes, nil message,
// metadata that Postgres jsonb cannot store). Such errors are permanent:
// the same handler run on the same message produces the same outbox
// message again.
var ErrInvalidOutboxMessage = errors.New("claimtx: invalid outbox message")

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

// Enqueue writes msgs to the outbox in tx, addressed to topic. They are
// published by a relay (package store/outbox) only after tx commits, and
// never if it rolls back: so a message exists if and only if the effect
// that produced it committed. Call it from a handler under the claim
// middleware with the claim transaction (framework.TxFromContext), or from
// any transaction of your own. Messages for several topics take one call
// per topic; the relay publishes rows in the order they were enqueued.
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
	if err := s.outbox.Insert(ctx, tx, topic, uuids, keys, payloads, metas); err != nil {
		return fmt.Errorf("claimtx: enqueue %d outbox message(s): %w", len(msgs), err)
	}
	return nil
}

// validateTopic refuses what no broker accepts and what Postgres would
// refuse later with a less helpful error.
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

// validateOutboxMessage refuses what Postgres would refuse later with a
// less helpful error: jsonb cannot hold NUL or invalid UTF-8, and
// json.Marshal would silently replace the latter.
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

// OutboxStats counts the outbox's rows. It scans the table: call it from
// health checks and tests, not per message.
func (s *Store) OutboxStats(ctx context.Context) (OutboxStats, error) {
	st, err := s.outbox.ReadStats(ctx, s.pool)
	return OutboxStats(st), err
}
