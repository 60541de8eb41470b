// Package store is claimtx's Postgres layer (pgx/v5): the claim table and
// the transactional outbox, their migrations, and the retention of claims.
//
// New binds a *Store to a schema and table names; Migrate (or MigrateTx,
// in a transaction of yours) creates or upgrades the tables from every
// instance at start-up. Claim and Enqueue work in your own transaction
// (package middleware claims around a Watermill handler; store/outbox
// relays what Enqueue wrote); Cleanup, or the partition calls, keep claims
// for RetentionConfig.Retention and no longer (the claimtx CLI runs them).
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
// conflict, on rollback it takes over. An effect table with a unique key
// per effect needs no claim row (middleware ModeNaturalKey), and versioned
// state none at all (VersionedUpsert); docs/effects.md compares these with
// the outbox.
//
// Errors a caller can act on are sentinels for errors.Is; invalid
// configurations are *framework.ConfigError naming the field.
//
// # Retention and partitions
//
// Claims are kept for RetentionConfig.Retention: a duplicate arriving
// after its claim was deleted is applied again, so pair it with
// middleware.ExpiryGuard at the same value. Cleanup deletes expired claims
// in batches; a table converted with EnablePartitioning (by the event's
// UTC day) drops whole days instead. docs/operations.md explains both.
package store
