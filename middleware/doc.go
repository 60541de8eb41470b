// Package middleware holds claimtx's Watermill middleware.
//
// Claim gives a handler exactly-once effects in Postgres on top of an
// at-least-once broker. For each message, in one transaction:
//
//	BEGIN
//	  INSERT INTO claimtx.processed_messages (consumer, message_key)
//	       VALUES ($1, $2) ON CONFLICT DO NOTHING   -- waits at most MaxClaimWait
//	  handler(msg) with the tx in its context        -- only if the claim inserted
//	COMMIT
//	return nil -> the router acks
//
// A duplicate (the claim already committed) commits without calling the
// handler and is acked. A handler error or panic rolls back claim and effect
// together and returns the error, so the broker redelivers. Transient
// database failures (serialization, deadlock, a claim wait longer than
// MaxClaimWait behind a twin's uncommitted claim, a lost connection) retry
// the whole transaction with a fresh one, up to MaxAttempts; OnRetry sees
// each retry (a TxRetry) and OnOutcome each pass (a Result).
//
// # Wiring
//
//	claim, err := middleware.NewClaim(middleware.Claim{Store: st, Consumer: "loyalty", Key: key})
//	if err != nil { return err } // a bad configuration cannot be installed
//	poison, err := middleware.NewPoison(middleware.Poison{Publisher: pub, Topic: "orders.poison"})
//	if err != nil { return err }
//	h := router.AddConsumerHandler("loyalty", "orders", sub,
//		middleware.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
//			_, err := tx.Exec(ctx, "INSERT INTO balances … ON CONFLICT (customer_id) DO UPDATE …", …)
//			return err
//		}))
//	h.AddMiddleware(poison, claim)
//
// Without a poison route, a message that can never be applied (a payload
// with no key, a framework.Permanent error) is nacked and redelivered
// forever. Make the effect an upsert, or fail when it touches no row: an
// UPDATE of a missing row changes nothing, and the claim still commits.
// examples/quickstart (the README's quick start) is this, complete.
//
// Watermill runs middleware in the order they were added, router-level and
// handler-level alike; put Recoverer, Poison (NewPoison) and Watermill's
// Retry before the claim, and ExpiryGuard (NewExpiryGuard) just before it
// when claims are removed after a retention window:
//
//	Recoverer -> Poison -> Retry -> ExpiryGuard -> Claim -> handler
//
// NewClaim, NewPoison, NewExpiryGuard and NewBatch return the configuration
// error (a *framework.ConfigError naming the field) instead of a
// middleware, so a broken one cannot be installed. Poison's policy is
// fixed: permanent errors and handler failures are dead-lettered with the
// reason (PoisonReasonKey), transient database failures and interrupted
// work are nacked. framework/consumer builds this chain from one
// configuration.
//
// # What the middleware does not do
//
// It does not ack or nack itself: the router does, from the returned error.
// It does not make effects outside Postgres exactly-once: an HTTP call made
// from the handler can happen again when the transaction rolls back. Write
// a message to the outbox instead (Store.Enqueue, or return it with
// Claim.OutboxTopic set): it commits with the claim and a relay (package
// store/outbox) delivers it afterwards with a stable idempotency key.
// Without OutboxTopic, a handler that returns messages under the claim
// fails with ErrProducedMessages instead of letting the router publish them
// outside the transaction.
//
// # Natural-key claims
//
// With Mode: ModeNaturalKey no claim row is written: the handler's own
// guarded statement (INSERT … ON CONFLICT (order_id) DO NOTHING) is the
// claim, and the handler returns framework.ErrAlreadyApplied when it found
// the effect present. Outcomes, hooks and retries are those of the claim
// table; such claims never expire. docs/effects.md compares the claim
// table, natural keys, versioned upserts and the outbox.
//
// # Batches
//
// NewBatch returns a Batch, which applies many messages in one claim
// transaction: one statement claims every key, a SetHandlerFunc applies
// the newly claimed messages at once, one commit, and Process returns one
// error per message for the caller to ack, nack or poison it. A failing
// message is isolated by bisection under savepoints and leaves no claim.
// Batches claim in the claim table only (no natural key, outbox topic,
// fingerprint or event time). framework/consumer's NewBatch runs one over
// a broker subscription; docs/batch.md explains it.
//
// # Compared with Watermill's Deduplicator
//
// Unlike Watermill's own Deduplicator (an in-memory, time-limited set of
// payload hashes, recorded before the handler runs), the claim commits
// atomically with the effect, survives restarts, is shared by every
// instance, and is only recorded when the effect is.
package middleware
