// Package storedefault holds the defaults of store.Config and
// store.RetentionConfig, for the store itself and for the code that must
// state or share them without a Store: the claimtx CLI prints them as flag
// defaults, and middleware.ExpiryGuard expires messages at the same
// retention as the store deletes their claims.
package storedefault

import "time"

// Defaults of store.Config.
const (
	Schema      = "claimtx"
	ClaimsTable = "processed_messages"
	OutboxTable = "outbox"
)

// Defaults of store.RetentionConfig.
const (
	// Retention keeps claims 30 days: redeliveries arrive within minutes,
	// dead-letter triage and replays within days to a couple of weeks
	// (see docs/operations.md for choosing it).
	Retention = 30 * 24 * time.Hour
	// MinRetention refuses retentions under 7 days unless forced: a
	// shorter one re-opens the door to duplicates from ordinary
	// dead-letter replays.
	MinRetention        = 7 * 24 * time.Hour
	BatchSize           = 5000
	MinBatchSize        = 500
	MaxBatchSize        = 50000
	TargetBatchDuration = 250 * time.Millisecond
	BatchPause          = 100 * time.Millisecond
	BatchTimeout        = time.Minute
	PartitionsAhead     = 7
	PartitionLockWait   = 2 * time.Second
	PartitionLockTries  = 5
)
