package pg

// The Default constants are the defaults of store.Config and
// store.RetentionConfig, for the store itself and for the code that must
// state or share them without a Store: the claimtx CLI prints them as flag
// defaults, and middleware.ExpiryGuard expires messages at the same
// retention as the store deletes their claims.

import "time"

// Defaults of store.Config.
const (
	DefaultSchema      = "claimtx"
	DefaultClaimsTable = "processed_messages"
	DefaultOutboxTable = "outbox"
)

// Defaults of store.RetentionConfig.
const (
	// DefaultRetention keeps claims 30 days: redeliveries arrive within minutes,
	// dead-letter triage and replays within days to a couple of weeks
	// (see docs/operations.md for choosing it).
	DefaultRetention = 30 * 24 * time.Hour
	// DefaultMinRetention refuses retentions under 7 days unless forced: a
	// shorter one re-opens the door to duplicates from ordinary
	// dead-letter replays.
	DefaultMinRetention        = 7 * 24 * time.Hour
	DefaultBatchSize           = 5000
	DefaultMinBatchSize        = 500
	DefaultMaxBatchSize        = 50000
	DefaultTargetBatchDuration = 250 * time.Millisecond
	DefaultBatchPause          = 100 * time.Millisecond
	DefaultBatchTimeout        = time.Minute
	DefaultPartitionsAhead     = 7
	DefaultPartitionLockWait   = 2 * time.Second
	DefaultPartitionLockTries  = 5
)
