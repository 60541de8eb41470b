// Package store is claimtx's Postgres layer (pgx/v5): the claim table and
// its migrations, the natural-key and versioned-upsert alternatives to a
// claim row, the outbox, retention, partitioned mode and the
// classification of database errors. The middleware writes no SQL of its
// own: every statement it runs is a Store method.
//
// New(pool, Config) returns a *Store bound to a schema (default "claimtx")
// and table names, validated against ^[a-z_][a-z0-9_]*$ (schemas at most
// 63 bytes, tables 48, so that derived index and partition names fit
// Postgres's limit) and always quoted.
//
// # Claims
//
// A claim is a row (consumer, message_key) in the claim table, inserted
// with INSERT … ON CONFLICT DO NOTHING in the same transaction as the
// effect, so the two share one fate. The middleware begins that
// transaction and claims in one round trip (BEGIN, the claim and its
// lock_timeout go out as one pipelined batch):
//
//	tx, res, err := st.BeginClaim(ctx, pgx.TxOptions{}, store.ClaimRequest{
//		Consumer: "loyalty", Key: "order-completed:9912", Wait: 5 * time.Second,
//	})
//	if err != nil { /* no transaction to end; store.Classify(err) says whether to retry */ }
//	defer tx.Rollback(ctx)
//	if res.New { /* apply the effect in tx */ }
//	err = tx.Commit(ctx)
//
// BeginClaimBatch does the same for many keys at once (middleware.Batch),
// and BeginNaturalKey begins the transaction for a natural-key claim. In a
// transaction of your own, Claim(ctx, tx, ClaimRequest) inserts the claim.
//
// A concurrent transaction claiming the same key blocks on the uncommitted
// row until the first ends: on commit it sees the conflict (res.New is
// false), on rollback it inserts and takes over. ClaimRequest.Wait bounds
// that wait with a lock_timeout that covers the claim only, not the effect
// after it; when it is hit the error classifies as CauseClaimWait. With
// ClaimRequest.PayloadHash a duplicate whose payload differs is reported
// (ClaimResult.FingerprintMismatch).
//
// # Migrations
//
// Migrate creates the schema and the claim table
//
//	processed_messages(consumer text, message_key text,
//	                   processed_at timestamptz default now(),
//	                   payload_hash bytea,
//	                   PRIMARY KEY (consumer, message_key))
//
// with an index on processed_at, and the outbox table. Migrations are
// embedded, numbered (migrations/NNN_name.up.sql / .down.sql), recorded in
// claimtx_migration, run in one transaction under an advisory lock, and
// idempotent: every instance of a service may call Migrate at start-up,
// all at once on an empty database. MigrateTx runs them in your own
// transaction; MigrateDown reverts to a version.
//
// # Errors
//
// Classify maps an error to a Cause by SQLSTATE and connection state:
// serialization (40001), deadlock (40P01), claim wait (55P03), connection
// (class 08, 57P01-57P03, lost or refused connections) are transient;
// unique violation (23505) and everything else are not. This is the only
// place in claimtx that reads SQLSTATE codes.
//
// # Natural keys
//
// An effect whose table has a unique key per effect needs no claim row:
// its own INSERT … ON CONFLICT DO NOTHING is the claim (middleware
// ModeNaturalKey). BeginNaturalKey begins that transaction with a
// lock_timeout for the whole of it, so the guarded INSERT waits behind an
// uncommitted twin no longer than a claim would.
//
// # Versioned upserts
//
// State that the producer versions needs no claim at all: VersionedUpsert
// writes it with ON CONFLICT … DO UPDATE … WHERE t.version <
// EXCLUDED.version, so duplicates and reordering are harmless. It suits
// state (an address, a status), never increments.
//
// # Outbox
//
// Enqueue writes messages in the caller's transaction to the outbox table
// (migration 002, default "outbox" in Schema); they exist if and only if
// that transaction commits. Package store/outbox relays them to a broker:
// ClaimOutbox locks a batch with FOR UPDATE SKIP LOCKED, MarkOutboxSent
// records a confirmed publish, DeleteSentOutbox cleans up. Every relayed
// message carries IdempotencyKeyMetadata, the same on every resend.
// docs/effects.md compares the four approaches.
//
// # Retention
//
// Claims are kept for a window, then deleted: a duplicate arriving after
// its claim was deleted is applied again, so RetentionConfig.Window must
// exceed every redelivery and replay delay you tolerate (pair it with
// middleware.ExpiryGuard). Cleanup deletes expired claims of a plain table
// in small adaptive batches, each its own transaction, with one leader at
// a time (the others get ErrNotLeader); cancel ctx to stop it and run it
// again to resume. Stats reports the table's size per claim, for sizing
// the window; docs/operations.md has the numbers.
//
// # Partitions
//
// A unique constraint on a partitioned table must include the partition
// key. Partitioning claims by processed_at would therefore make the
// primary key (consumer, message_key, processed_at): a redelivery processed
// on another day would land in another partition, meet no conflict and be
// applied twice. claimtx partitions by event_day instead, the UTC day of
// the producer's event time (EventDay), which every redelivery carries
// unchanged, so twins always meet in the same partition and the primary
// key (consumer, message_key, event_day) is as strong as
// (consumer, message_key). Claims then say the event time
// (ClaimRequest.EventTime).
//
// Retention then drops whole days: a day whose every event time is older
// than the retention horizon is detached (CONCURRENTLY, so claims are never
// blocked) and dropped, which costs the same for ten rows or ten million.
// A message for a dropped day finds no partition and fails with
// ErrNoPartition instead of being applied again; middleware.ExpiryGuard
// turns the same condition into a clean "expired" before the claim.
//
// PreparePartitioning and EnablePartitioning convert a plain table online;
// CreatePartitionsAhead and DropExpiredPartitions are the maintenance to
// run daily, configured by PartitionConfig. Cleanup refuses a partitioned
// table (ErrPartitioned).
//
// # Tests
//
// Package pgtest gives each test its own schema on a shared server.
package store
