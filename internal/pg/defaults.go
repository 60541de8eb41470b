package pg

// The defaults of store.Config, store.RetentionConfig and the claim
// transaction, here for the code that states or shares them without a
// Store (the CLI's flags, middleware.ExpiryGuard, consumer.Config.String).

import (
	"cmp"
	"time"

	"github.com/jackc/pgx/v5"
)

// Defaults of store.Config.
const (
	DefaultSchema      = "claimtx"
	DefaultClaimsTable = "processed_messages"
	DefaultOutboxTable = "outbox"
)

// Defaults of store.RetentionConfig.
const (
	// DefaultRetention outlasts dead-letter triage and replays
	// (docs/operations.md: choosing the window).
	DefaultRetention = 30 * 24 * time.Hour
	// DefaultMinRetention: shorter lets ordinary replays duplicate.
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
	DefaultMaxClaimWait   = 5 * time.Second
	DefaultMaxAttempts    = 5
	DefaultInitialBackoff = 10 * time.Millisecond
	DefaultMaxBackoff     = time.Second
	// DefaultMaxGroup: group commit's bound (middleware.Claim.MaxGroup).
	DefaultMaxGroup     = 16
	DefaultMaxGroupTime = 50 * time.Millisecond
	// DefaultMaxKeyBytes keeps keys far below Postgres' btree entry limit
	// (~2.7 kB).
	DefaultMaxKeyBytes = 512
)

// Grouping reports whether claims with this MaxGroup and isolation (zero:
// their defaults) commit in groups (middleware.Claim.MaxGroup): a step
// rolled back to its savepoint leaves no trace in a commit's fate only
// under READ COMMITTED.
func Grouping(maxGroup int, iso pgx.TxIsoLevel) bool {
	return cmp.Or(maxGroup, DefaultMaxGroup) > 1 && cmp.Or(iso, pgx.ReadCommitted) == pgx.ReadCommitted
}
