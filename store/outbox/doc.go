// Package outbox relays claimtx's transactional outbox to a broker.
//
// A handler under the claim middleware writes messages to the outbox table
// in its claim transaction (Store.Enqueue, or by returning them with
// middleware.Claim.OutboxTopic set). They exist if and only if the effect
// committed. A Relay then publishes them through any Watermill
// message.Publisher — RabbitMQ or Kafka by configuration
// (brokers.NewPublisher) — and marks them sent:
//
//	BEGIN
//	  SELECT … FROM <schema>.outbox WHERE sent_at IS NULL
//	   ORDER BY id LIMIT <BatchSize> FOR UPDATE SKIP LOCKED
//	  Publish(topic, msgs…)          -- returns after the broker confirmed
//	  UPDATE … SET sent_at = now() WHERE id = ANY(<published>)
//	COMMIT
//
//	relay, err := outbox.New(st, pub, outbox.Config{})
//	go relay.Run(ctx)
//
// # Guarantees
//
// At least once: a row is marked only after Publish returned nil for it. A
// relay that dies between Publish and COMMIT loses its marks and its row
// locks with its connection, and the rows are published again. Every
// message carries store.IdempotencyKeyMetadata ("claimtx_idempotency_key"),
// the same on every resend of the row, so a downstream claimtx consumer
// keyed "metadata:claimtx_idempotency_key" records resends as duplicates,
// and an HTTP effect forwards it as the provider's Idempotency-Key. The
// Watermill UUID is the same on every resend too.
//
// Several relays, in one process or many, share the backlog: FOR UPDATE
// SKIP LOCKED hands each pending row to one relay transaction at a time, so
// no row is published by two relays concurrently. A row can still be
// published twice in sequence (a relay died after publishing it), never
// lost.
//
// # Ordering
//
// One relay publishes its batch in id order and stops the batch at the
// first failed Publish, so with a single relay running, rows of a topic
// reach the broker in id order. Ids are assigned at insert, not at commit:
// of two concurrent handler transactions, the later id may commit, and be
// published, first. With several relays, batches are published in
// parallel, so there is no order across batches at all, and a resend after
// a crash arrives after newer messages. Consumers that need order must
// carry it in the data — a version or sequence number applied with
// store.VersionedUpsert — rather than rely on the relay.
//
// # Wake-ups, failures, cleanup
//
// Enqueue sends a NOTIFY on the channel claimtx_outbox at commit; each
// Relay listens on a dedicated connection and polls every PollInterval as
// a fallback. A failed Publish (broker down) records attempts and last_error
// on the row, leaves it pending and backs off; the relay resumes where it
// stopped once the broker is back. Sent rows are kept for Retention and
// deleted in batches by Cleanup, which Run calls every CleanupInterval.
// OnBatch reports every relay transaction (rows locked and published, the
// error, the duration), for logs and metrics.
package outbox
