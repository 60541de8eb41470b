package pg

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/claimtx/claimtx/internal/kafkarecord"
)

// ClaimRequest is store.ClaimRequest, field for field, so one converts to
// the other.
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
// store, unexported there; claimsql and poisonsql document
// the methods (a Begin method's error leaves no transaction).
type Claims interface {
	Begin(ctx context.Context, opts TxOptions, r ClaimRequest, look Lookups, more func(*pgx.Batch)) (tx pgx.Tx, res ClaimResult, found Found, err error)
	BeginBatch(ctx context.Context, opts TxOptions, consumer string, keys []string, maxClaimWait time.Duration, withMemo bool, orderKeys []string) (tx pgx.Tx, claimed []string, memos map[string]string, parked map[string]bool, err error)
	BeginNaturalKey(ctx context.Context, opts TxOptions, maxClaimWait time.Duration, more func(*pgx.Batch)) (pgx.Tx, error)
	Step(ctx context.Context, tx pgx.Tx, r *ClaimRequest, look Lookups, lockWait time.Duration) (ClaimResult, Found, error)
	Following(ctx context.Context, consumer string, anchors []string, n int, add func(key string)) error
	Positions() Positions

	RecordMemo(ctx context.Context, consumer, key string, err error) error
	// Lacking reports whether table (schema-qualified by the store) exists
	// and which of privileges the role lacks on it.
	Lacking(ctx context.Context, table string, privileges ...string) (exists bool, lacking []string, err error)
	RecordDeadLetter(ctx context.Context, l DeadLetter) error
	CanRecordDeadLetter(ctx context.Context) (bool, error)

	// SyncStandby checks that the server has the synchronous standby a
	// commit with synchronousCommit needs (standby.State.Shortfall).
	SyncStandby(ctx context.Context, synchronousCommit string) (shortfall string, verified bool, err error)
}

// SavepointRollback undoes the current step of a group transaction.
const SavepointRollback = "ROLLBACK TO SAVEPOINT claimtx_group"

// DeadLetter is one row of the dead-letter table.
type DeadLetter struct {
	Consumer string
	Key      string // "" (NULL) when it could not be derived
	// Topic is where the message was consumed from, PoisonTopic the
	// destination that refused its copy.
	Topic, PoisonTopic string
	UUID               string
	Reason             string // the bounded reason the copy carried
	Permanent          bool
	PublishError       string // the broker's refusal
	Payload            []byte
	Metadata           map[string]string // the refused copy's
}

// Positions are the stored Kafka positions of a store's schema
// (claimsql.PositionStatements).
type Positions interface {
	Queue(b *pgx.Batch, consumer string, ps ...kafkarecord.Settled)
	Store(ctx context.Context, db Execer, consumer string, ps []kafkarecord.Settled) error
	Of(ctx context.Context, consumer string) ([]kafkarecord.Settled, error)
	Loader(consumer string) kafkarecord.Loader
}

// ClaimsOf returns the Claims of a *store.Store; store's init sets it.
var ClaimsOf func(store any) Claims

// Querier reads one row: a transaction, a connection or a pool.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DB runs statements: a pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Memo is one poison memo row.
type Memo struct {
	Consumer   string    `json:"consumer"`
	Key        string    `json:"key"`
	Reason     string    `json:"reason"`
	PoisonedAt time.Time `json:"poisoned_at"`
	Seen       int64     `json:"seen"`
}

// MemoFilter selects memos of one consumer: every condition set must hold.
type MemoFilter struct {
	Consumer       string        // required
	Keys           []string      // when not empty, only these keys
	ReasonContains string        // when set, reasons containing it (case sensitive)
	OlderThan      time.Duration // when positive, memos last poisoned longer ago (database clock)
}

// Memos are the poison memo statements of one schema, for the operator
// commands outside store (store/internal/poisonsql documents them).
type Memos interface {
	Exists(ctx context.Context) (bool, error)
	Record(ctx context.Context, consumer, key string, err error) error
	Get(ctx context.Context, consumer, key string) (m Memo, ok bool, err error)
	Memoised(ctx context.Context, consumer string, keys []string) (map[string]bool, error)
	Clear(ctx context.Context, f MemoFilter) (int64, error)
	Count(ctx context.Context, f MemoFilter) (int64, error)
}

// MemosOf returns the Memos of n's schema, run on db; store's init sets
// it, so a package that calls it imports store.
var MemosOf func(db DB, n *Names) Memos

// EventDay returns the UTC day of an event time, the partition key: the
// same day for every consumer, whatever its time zone.
func EventDay(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}
