package pg

// Claims is the bridge between the claim middleware and the store: the
// middleware begins its transactions with the claim through it, so every
// claim statement stays in store (store/internal/claimsql), without making
// this plumbing part of store's exported API. store fills in ClaimsOf.

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/claimtx/claimtx/internal/kafkarecord"
)

// ClaimRequest is store.ClaimRequest, field for field, so that one
// converts to the other (see there for the fields).
type ClaimRequest struct {
	Consumer     string
	Key          string
	MaxClaimWait time.Duration
	EventTime    time.Time
	PayloadHash  []byte
}

// ClaimResult is store.ClaimResult, field for field.
type ClaimResult struct {
	New                 bool
	FingerprintMismatch bool
}

// Execer runs a statement: a transaction, a connection or a pool.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Claims is what the claim middleware and framework/consumer do through a
// store. On success the Begin methods hand the caller a transaction to
// Commit or Rollback; on error there is none.
type Claims interface {
	// Begin begins a transaction and makes the claim r in it, in one
	// round trip, with the poison memo lookup when withMemo (memo is its
	// reason, nil without one) and more queued after the claim.
	Begin(ctx context.Context, opts TxOptions, r ClaimRequest, withMemo bool, more func(*pgx.Batch)) (tx pgx.Tx, res ClaimResult, memo *string, err error)
	// BeginBatch begins a transaction and claims many keys of consumer in
	// it, in one round trip; claimed are the new keys, sorted, memos the
	// new keys with a poison memo (unclaimed again) when withMemo.
	BeginBatch(ctx context.Context, opts TxOptions, consumer string, keys []string, maxClaimWait time.Duration, withMemo bool) (tx pgx.Tx, claimed []string, memos map[string]string, err error)
	// BeginNaturalKey begins the transaction of a natural-key claim, with
	// a lock_timeout of maxClaimWait and more queued in the same round trip.
	BeginNaturalKey(ctx context.Context, opts TxOptions, maxClaimWait time.Duration, more func(*pgx.Batch)) (pgx.Tx, error)
	// Following reads ahead of a replay: the keys of consumer's committed
	// claims after the earliest claim among anchors, at most n.
	Following(ctx context.Context, consumer string, anchors []string, n int, add func(key string)) error
	// Positions are the stored Kafka positions.
	Positions() Positions

	// RecordMemo records the poison memo of consumer's key, poisoned
	// because of err.
	RecordMemo(ctx context.Context, consumer, key string, err error) error
	// RecordDeadLetter inserts l and returns once the row is committed.
	RecordDeadLetter(ctx context.Context, l DeadLetter) error
	// CanRecordDeadLetter reports whether the database role may insert
	// into the dead-letter table.
	CanRecordDeadLetter(ctx context.Context) (bool, error)

	// SyncStandby checks that the server can keep the promise of a claim
	// committed with synchronous_commit (remote_write, remote_apply: a
	// synchronous standby). shortfall says what is missing, "" when
	// nothing is; verified is false when only synchronous_standby_names
	// could be read, not which standbys are synchronous.
	SyncStandby(ctx context.Context, synchronousCommit string) (shortfall string, verified bool, err error)
}

// DeadLetter is one row of the dead-letter table.
type DeadLetter struct {
	Consumer string
	// Key is the claim key; "" when it could not be derived (NULL).
	Key string
	// Topic is where the message was consumed from, PoisonTopic the
	// destination that refused its copy.
	Topic, PoisonTopic string
	UUID               string
	// Reason is the bounded reason the copy carried.
	Reason    string
	Permanent bool
	// PublishError is the broker's refusal.
	PublishError string
	Payload      []byte
	// Metadata is the refused copy's: the original's with the poison
	// bookkeeping.
	Metadata map[string]string
}

// Positions are the stored Kafka positions of a store's schema.
type Positions interface {
	// Queue queues the upsert of p for consumer on b.
	Queue(b *pgx.Batch, consumer string, p kafkarecord.Settled)
	// Store raises the stored positions ps of consumer in db: the claim
	// transaction, or the pool for records already settled.
	Store(ctx context.Context, db Execer, consumer string, ps []kafkarecord.Settled) error
	// Of returns consumer's stored positions, by topic and partition.
	Of(ctx context.Context, consumer string) ([]kafkarecord.Settled, error)
	// Loader is the kafkarecord.Loader of consumer's stored positions.
	Loader(consumer string) kafkarecord.Loader
}

// ClaimsOf returns the Claims of a *store.Store; store sets it in its init,
// which has run whenever a caller holds a *store.Store.
var ClaimsOf func(store any) Claims

// EventDay returns the UTC day of an event time: the partition key. UTC,
// never local time, so every consumer, whatever its time zone, computes
// the same day for the same message.
func EventDay(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}
