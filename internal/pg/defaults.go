package pg

// The Default constants are the defaults of store.Config,
// store.RetentionConfig and the claim transaction, for the store and the
// claim themselves and for the code that must state or share them without
// a Store: the claimtx CLI prints them as flag defaults,
// middleware.ExpiryGuard expires messages at the same retention as the
// store deletes their claims, and consumer.Config.String prints the
// effective configuration.

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

// Defaults of the claim transaction (middleware.Claim) and of the keys it
// claims (framework.KeyPolicy).
const (
	// DefaultMaxClaimWait is the claim's lock_timeout behind a twin's
	// uncommitted claim.
	DefaultMaxClaimWait   = 5 * time.Second
	DefaultMaxAttempts    = 5
	DefaultInitialBackoff = 10 * time.Millisecond
	DefaultMaxBackoff     = time.Second
	// DefaultMaxKeyBytes keeps keys far below Postgres' btree entry limit
	// (~2.7 kB).
	DefaultMaxKeyBytes = 512
)
