// Package store is claimtx's Postgres layer (pgx/v5): the claim table and
// the transactional outbox, their migrations, and the retention of claims.
//
// What an application calls:
//
//   - New(pool, Config) returns a *Store bound to a schema (default
//     "claimtx") and table names, validated against ^[a-z_][a-z0-9_]*$
//     (schemas at most 63 bytes, tables 48, so that derived index and
//     partition names fit Postgres's limit) and always quoted.
//   - Migrate creates or upgrades the tables; every instance may call it at
//     start-up. MigrateTx does the same in a transaction of yours.
//   - Claim(ctx, tx, ClaimRequest) claims a message in your own
//     transaction. The claim middleware (package middleware) does it for
//     you around a Watermill handler.
//   - Enqueue(ctx, tx, topic, msgs...) writes messages to the outbox in
//     your transaction; package store/outbox relays them to a broker.
//   - NewVersionedUpsert builds the write of versioned state, which needs
//     no claim at all.
//   - Cleanup, or on a partitioned claim table CreatePartitionsAhead and
//     DropExpiredPartitions, keeps claims for RetentionConfig.Retention
//     and no longer. The claimtx CLI runs them for operators.
//   - IsTransient says whether a failed transaction is worth retrying.
//
// # Claims
//
// A claim is a row (consumer, message_key) in the claim table, inserted
// with INSERT … ON CONFLICT DO NOTHING in the same transaction as the
// effect, so the two share one fate:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		res, err := st.Claim(ctx, tx, store.ClaimRequest{
//			Consumer: "loyalty", Key: "order-completed:9912", MaxClaimWait: 5 * time.Second,
//		})
//		if err != nil || !res.New {
//			return err // on a duplicate the effect is already there
//		}
//		_, err = tx.Exec(ctx, "UPDATE points SET balance = balance + 10 WHERE customer_id = $1", 42)
//		return err
//	})
//	// store.IsTransient(err): run the whole transaction again.
//
// A concurrent transaction claiming the same key blocks on the uncommitted
// row until the first ends (the claim wait): on commit it sees the
// conflict (res.New is false), on rollback it inserts and takes over.
// ClaimRequest.MaxClaimWait bounds the claim wait with a lock_timeout that
// covers the claim only, not the effect after it; past it the error is
// transient. With ClaimRequest.PayloadHash a duplicate whose payload
// differs is reported (ClaimResult.FingerprintMismatch).
//
// The claim middleware runs the same statement, pipelined with its BEGIN
// in one round trip, and claims a batch of keys in one statement for
// middleware.Batch.
//
// # Migrations
//
// Migrate creates the schema and the claim table
//
//	processed_messages(consumer text, message_key text,
//	                   processed_at timestamptz default now(),
//	                   payload_hash bytea,
//	                   xact xid8 default pg_current_xact_id(),
//	                   PRIMARY KEY (consumer, message_key))
//
// with an index on processed_at, the outbox table (whose rows carry xact
// too: `claimtx explain` lists the outbox rows of a claim's transaction),
// and the poison memo table processed_messages_poison_memo
// (middleware.Claim.PoisonMemo), whose rows Cleanup and
// DropExpiredPartitions delete by age like claims. Migrations are
// embedded, numbered, recorded in <schema>.claimtx_migration, each run in
// one transaction with its bookkeeping under an advisory lock, and
// idempotent: every instance of a service may call Migrate at start-up,
// all at once on an empty database. An up-to-date schema is recognised
// with reads only, so a role without CREATE can call it too. Version
// reports the applied version (framework/observe's Health compares it
// with the one this build needs).
//
// # Errors
//
// IsTransient reports the failures a retry of the whole transaction can
// overcome: serialization failures (SQLSTATE 40001), deadlocks (40P01), a
// claim wait past its bound (55P03), and lost, refused or shutting-down
// connections (class 08, 57P01-57P03). A unique violation (23505) and
// everything else are not transient. The claim middleware retries exactly
// these. Errors of this package that a caller can act on are sentinels
// for errors.Is: ErrNoPartition, ErrInvalidOutboxMessage, ErrNoClaimTable,
// ErrNotLeader, ErrPartitioned and ErrNotPartitioned. Invalid
// configurations are *framework.ConfigError naming the field.
//
// # Natural keys
//
// An effect whose table has a unique key per effect needs no claim row:
// its own INSERT … ON CONFLICT DO NOTHING is the claim (middleware
// ModeNaturalKey, where the middleware bounds the whole transaction's
// lock waits by the max claim wait).
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
// (default "outbox" in Schema); they exist if and only if that
// transaction commits, and it notifies relays at commit. A Relay of
// package store/outbox publishes them, at least once, each carrying
// IdempotencyKeyMetadata, the same on every resend, for downstream
// consumers to deduplicate on. OutboxStats reports the backlog.
// docs/effects.md compares the four approaches.
//
// # Retention
//
// Claims are kept for RetentionConfig.Retention, then deleted: a
// duplicate arriving after its claim was deleted is applied again, so the
// retention must exceed every redelivery and replay delay you tolerate
// (pair it with middleware.ExpiryGuard at the same value). MinRetention
// refuses a typo such as 30h for 30d unless Force is set. Cleanup deletes
// expired claims of a plain table in small adaptive batches, each its own
// transaction, with one leader at a time (the others get ErrNotLeader);
// cancel ctx to stop it and run it again to resume. Stats reports the
// table's size per claim, for sizing the retention; docs/operations.md
// has the numbers.
//
// # Partitions
//
// Deleting rows costs in proportion to the rows; dropping a partition
// costs the same for ten rows or ten million. But a unique constraint on a
// partitioned table must include the partition key. Partitioning claims
// by processed_at would make the primary key (consumer, message_key,
// processed_at): a redelivery processed on another day would land in
// another partition, meet no conflict and be applied twice. claimtx
// partitions by event_day instead, the UTC day of the producer's event
// time, which every redelivery carries unchanged, so twins always meet in
// the same partition and the primary key (consumer, message_key,
// event_day) is as strong as (consumer, message_key). Claims then say the
// event time (ClaimRequest.EventTime; the middleware's Claim.EventTime).
//
// Retention then drops whole days: a day whose every event time is older
// than the retention horizon is detached (CONCURRENTLY, so claims are never
// blocked) and dropped. A message for a dropped day finds no partition and
// fails with ErrNoPartition instead of being applied again;
// middleware.ExpiryGuard turns the same condition into a clean "expired"
// before the claim.
//
// PreparePartitioning (online, for a rolling switch of consumers to event
// times) and EnablePartitioning convert a plain table; existing claims
// stay as one legacy partition that expires like a day. ClaimsByEventDay
// says whether claims must carry an event time. CreatePartitionsAhead and
// DropExpiredPartitions are the maintenance to run daily, with the same
// RetentionConfig as the conversion (Ahead days ahead, DDL lock waits
// bounded by LockWait). Cleanup refuses a partitioned table
// (ErrPartitioned), and partition maintenance a plain one
// (ErrNotPartitioned).
package store
