// Package store is claimtx's Postgres layer (pgx/v5): the claim table, its
// migrations and the classification of database errors.
//
// # The claim
//
// Inside the caller's transaction, Claim inserts (consumer, key) into the
// claim table with INSERT … ON CONFLICT DO NOTHING and reports whether the
// row is new:
//
//	claimed, err := st.Claim(ctx, tx, "loyalty", "order-completed:9912")
//	if !claimed { /* an earlier delivery already committed this effect */ }
//
// A concurrent transaction claiming the same key blocks on the uncommitted
// row until the first ends: on commit it sees the conflict (false), on
// rollback it inserts (true) and takes over. ClaimWait bounds that wait.
//
// # Migrations
//
// Migrate creates the schema (default "claimtx") and the table
//
//	processed_messages(consumer text, message_key text,
//	                   processed_at timestamptz default now(),
//	                   PRIMARY KEY (consumer, message_key))
//
// with an index on processed_at. Migrations are embedded, numbered
// (migrations/NNN_name.up.sql / .down.sql), recorded in claimtx_migration,
// run in one transaction under an advisory lock, and idempotent: every
// instance of a service may call Migrate at start-up, all at once on an
// empty database. MigrateTx runs them in your own transaction. Schema and table names are validated against
// ^[a-z_][a-z0-9_]*$ (schemas at most 63 bytes, tables 48, so that derived
// index and partition names fit Postgres's limit) and always quoted.
//
// # Errors
//
// Classify maps an error to a Cause by SQLSTATE and connection state:
// serialization (40001), deadlock (40P01), claim wait (55P03), connection
// (class 08, 57P01-57P03, lost or refused connections) are transient;
// unique violation (23505) and everything else are not. This is the only
// place in claimtx that reads SQLSTATE codes.
//
// # Natural keys and versioned upserts
//
// An effect whose table has a unique key per effect needs no claim row:
// its INSERT … ON CONFLICT DO NOTHING is the claim (middleware
// ModeNaturalKey). State that the producer versions needs no claim at all:
// VersionedUpsert writes it with ON CONFLICT … DO UPDATE … WHERE
// t.version < EXCLUDED.version, so duplicates and reordering are harmless.
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
// # Tests
//
// Package pgtest gives each test its own schema on a shared server.
package store
