package pg

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lookups are what a claim's round trip reads besides the claim.
type Lookups struct {
	Memo bool // the poison memo of the claim's key
	// OrderKey, when not "", is looked up among the parked order keys, FOR
	// SHARE: a release of the key waits for the claim's transaction.
	OrderKey string
}

// Found is what Lookups found.
type Found struct {
	Memo   *string // the memo's reason, nil without one
	Parked bool    // the order key is parked
}

// ParkedMessage is one row of the parked table (migration 009).
type ParkedMessage struct {
	ID       int64             `json:"id"`
	Consumer string            `json:"consumer"`
	OrderKey string            `json:"order_key"`
	Key      string            `json:"key"`
	UUID     string            `json:"uuid"`
	Payload  []byte            `json:"payload"`
	Metadata map[string]string `json:"metadata"`
	// Reason is why it failed; "" for a message parked behind another.
	Reason   string    `json:"reason,omitempty"`
	ParkedAt time.Time `json:"parked_at"`
}

// ParkedKey is one parked order key.
type ParkedKey struct {
	Consumer string    `json:"consumer"`
	OrderKey string    `json:"order_key"`
	Reason   string    `json:"reason"` // why its head last failed
	ParkedAt time.Time `json:"parked_at"`
	Failures int       `json:"failures"`
	// RetryAt is when a release is due; nil: only when an operator asks.
	RetryAt     *time.Time `json:"retry_at"`
	SkipHead    bool       `json:"skip_head"`
	RequestedBy string     `json:"requested_by,omitempty"`
	RequestNote string     `json:"request_note,omitempty"`
	Messages    int64      `json:"messages"`
}

// ParkedStats sums up one consumer's parked keys.
type ParkedStats struct {
	Consumer string    `json:"consumer"`
	Keys     int64     `json:"keys"`
	Messages int64     `json:"messages"`
	Oldest   time.Time `json:"oldest"` // the oldest key's parking time
}

// Release is one release transaction: tx holds the key's row FOR UPDATE;
// Head is the oldest parked message of the key, nil when none is left (the
// key row is then deleted and tx committed).
type Release struct {
	Tx   pgx.Tx
	Key  ParkedKey
	Head *ParkedMessage
}

// Parking is the parked messages of a store (store/internal/parksql
// documents the methods).
type Parking interface {
	ParkBehind(ctx context.Context, tx pgx.Tx, ms ...ParkedMessage) error
	ParkHead(ctx context.Context, m ParkedMessage, retryAt *time.Time) (parked bool, err error)

	Due(ctx context.Context, consumer string, limit int) ([]string, error)
	BeginRelease(ctx context.Context, opts TxOptions, consumer, orderKey string) (*Release, error)
	Released(ctx context.Context, r *Release) error
	ReleaseFailed(ctx context.Context, consumer, orderKey, headKey, reason string, retryAt *time.Time) error

	Keys(ctx context.Context, consumer string, limit int) ([]ParkedKey, error)
	Key(ctx context.Context, consumer, orderKey string) (ParkedKey, bool, error)
	Messages(ctx context.Context, consumer, orderKey string, limit int) ([]ParkedMessage, error)
	Request(ctx context.Context, consumer, orderKey string, skip bool, by, note string) (bool, error)
	Stats(ctx context.Context) ([]ParkedStats, error)
}

// ParkingOf returns the Parking of a *store.Store; store's init sets it.
var ParkingOf func(store any) Parking

// HeldError is a batch's result for a message held back behind Head, the
// index in the batch of an earlier message of its order key that failed
// alone (Err): it was not applied, for it depends on Head, and it shares
// Head's fate once that is settled (framework/consumer's batch runner):
// parked behind it, nacked with it, or retried after it. It does not
// unwrap to Err: a held message is not itself permanent.
type HeldError struct {
	Head int
	Err  error
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("claimtx: held back behind message %d of the batch, an earlier message of its order key, which failed: %v", e.Head, e.Err)
}
