// Package nats is claimtx's NATS JetStream adapter. Importing it registers
// the "nats" kind (brokers.Register), as brokers/amqp and brokers/kafka
// register theirs:
//
//	import _ "github.com/claimtx/claimtx/brokers/nats"
//
//	cfg, err := brokers.LoadConfig("") // BROKER=nats NATS_URL=... NATS_DURABLE=billing
//	...
//	sub, err := brokers.NewSubscriber(cfg, logger)
//
// or, for a consumer, consumer.Config{Broker: cfg, ...}.
//
// It is written against the public brokers.Factory, brokers.Register and
// brokers.Config API and framework.ConfigError, like an adapter of your
// own, except for its settings: as a built-in kind, its section of
// brokers.Config is typed (brokers.NATSConfig), where a registered kind
// reads Config.Options. It is the worked example of docs/adapters.md,
// "Writing your own adapter". Publishing is watermill-nats v2's JetStream
// publisher; consuming is this package's own subscriber on nats.go,
// with watermill-nats's wire format (see "Why not watermill-nats's
// subscriber").
//
// # Settings
//
// Everything is read from brokers.Config.NATS (brokers.NATSConfig): nats:
// in a YAML file, or NATS_<SETTING> variables (brokers.LoadConfig, the
// environment over the file). With BROKER=nats an unknown NATS_* variable
// is an error, so a typo (NATS_ACKWAIT) does not silently become a
// default; so is an unknown key in a file. Every problem is a
// *framework.ConfigError naming NATS_<SETTING> when the value came from
// the environment, nats.<key> when it came from a file.
//
// Every setting, its default and its trade-off: brokers.NATSConfig and
// docs/configuration.md.
//
// A password or token printed with the Config (Config.String) is redacted,
// as is the password of a URL; a token written as the URL's user
// (nats://token@host) is not: use NATS_TOKEN. NATS_URL, NATS_PASSWORD and
// NATS_TOKEN may come from a file (NATS_PASSWORD_FILE, ...). Errors never
// quote the URL.
//
// There is no default durable, for the reason Kafka has no default
// consumer group: two services sharing one would split the messages
// between them. framework/consumer sets it to the consumer's Name (as it
// does the Kafka consumer group) when that is a durable name; otherwise
// set NATS_DURABLE, one per service; the replicas of a service share it.
// Publishers need none.
//
// # Subjects and streams
//
// A Watermill topic is the subject subject_prefix + topic. Subscribe and
// Publish first look for a stream that captures the subject (any stream:
// an operator's "orders.>" stream is used as it is). When none does:
//
//   - streams: create (the default) creates one, named after the subject
//     with every character a stream name cannot hold replaced by '_'
//     ("order-completed.poison" -> "order-completed_poison"), capturing
//     that one subject, file storage, limits retention and no limits.
//     The poison topic, TOPIC.poison, gets a stream of its own the first
//     time something is poisoned, so poisoned messages never mix with the
//     topic's. Without limits nothing is removed: set max age or size on
//     the streams (nats stream edit) as you would a Kafka retention. The
//     subscriber's ReplayHorizon reports the max age, which
//     framework/consumer and `claimtx stats` compare with the claim
//     retention (count and size limits only remove messages sooner).
//     Limits, not interest or work-queue retention, because interest
//     retention drops a message published while no consumer exists yet,
//     and a work queue allows one consumer per subject, not one per
//     service.
//   - streams: require creates nothing: publishing or subscribing to a
//     subject no stream captures fails with an error naming the subject.
//     For operators who manage streams (replicas, limits, placement)
//     themselves; create the poison streams too.
//
// Subscribe then creates the durable consumer if it does not exist: a pull
// consumer on that subject with explicit acks, the configured ack_wait,
// max_deliver and max_ack_pending, from the start of the stream; every
// replica's workers pull from it, so they share the work. An existing one
// is checked (pull, that subject, explicit acks) and its ack_wait,
// max_deliver and max_ack_pending are updated to the configuration. The
// adapter creates the consumer itself because nats.go deletes a consumer
// its subscription created when that subscription ends, which would pull
// the consumer from under the other replicas.
//
// # Delivery: ack, nack, poison
//
// Each Subscribe starts concurrency workers; each pulls one message (a
// pull waits up to a second, then asks again) and holds it until the
// router acks or nacks it. Pulling one at a time, rather than having
// JetStream push messages into a client buffer, matters: JetStream starts a
// message's ack wait when it delivers it, so a pushed message waiting
// behind busy handlers would be redelivered to another replica while its
// first copy still waits, and both would be processed (a message that
// cannot be keyed would be poisoned twice). Then:
//
//   - Ack (the claim committed, or the message was a duplicate, or its
//     copy went to TOPIC.poison): AckSync, confirmed by the server.
//   - Nack (a transient failure the claim's retries did not absorb):
//     NakWithDelay(nack_delay). JetStream redelivers the message after the
//     delay; the subscription takes other messages meanwhile (unlike
//     RabbitMQ's, the delay is the server's).
//   - Poison is claimtx's, not JetStream's: middleware.Poison publishes a
//     copy to TOPIC.poison (its own stream) with the reason in the header
//     claimtx_poison_reason, then the original is acked. JetStream's
//     Term is never used: it would drop the message.
//   - While the handler works, the subscription tells JetStream the
//     message is in progress every ack_wait/2, so ack_wait is how long a
//     crashed or disconnected consumer's messages wait before JetStream
//     redelivers them, not a bound on the handler (use
//     consumer.Config.HandlerTimeout for that).
//   - When a subscription ends (the consumer shuts down), its workers
//     finish their pulls (a second at most) and every message they hold
//     that was not acked or nacked is nacked without delay, so a replica
//     takes it at once. After a SIGKILL they come back after ack_wait.
//
// max_ack_pending caps the messages delivered and not yet acked across all
// replicas of the durable (it is the consumer's setting, not a process's):
// keep it at or above replicas × concurrency, or replicas wait for one
// another. JetStream also holds at most 512 waiting pulls per consumer (its
// max_waiting default): replicas × concurrency above that makes the extra
// workers retry (logged at debug level) instead of waiting.
//
// # MaxDeliver
//
// When a message has been delivered max_deliver times, JetStream stops
// redelivering it, silently: it stays in the stream, the consumer skips
// it, and all that is left is an advisory on
// $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>. No
// dead-letter stream receives it (TestMaxDeliverGivesUpSilently shows it:
// after the last allowed nack the consumer has nothing pending or unacked,
// and the stream still holds the message). For claimtx that would be a lost
// message: deliveries are not handler failures (those are retried in
// process and then poisoned, within one delivery); a message is delivered
// again after a nack (the database was down longer than the claim's
// retries), a crash, a shutdown hand-back or a lost connection, none of
// which says anything about the message. A database outage of a few
// minutes with a 1s nack delay would exhaust a max_deliver of 100. So the
// default is -1, unlimited; claimtx's own poison path, which acts on the
// message's first delivery that fails for a reason of its own, is what
// bounds a bad message. Set a positive max_deliver only if you watch the
// advisories.
//
// # Metadata
//
// Headers arrive as metadata of the same name (a header with several
// values as one, joined with ", "). The adapter adds what describes the
// delivery: nats_subject, nats_stream, nats_sequence (the stream
// sequence), nats_delivered (1 on the first delivery) and nats_timestamp
// (when the stream stored the message, RFC 3339, UTC). They are never
// published again (a poison copy does not carry them), nor are a
// producer's Nats-Expected-* headers; none makes a claim key: they change
// when a message is published again. Metadata becomes headers on publish:
// a key that is not an HTTP token (a space, a ':') is an error, and values
// follow HTTP header rules (trimmed; a line break becomes a space, so a
// multi-line poison reason arrives on one line). The Watermill UUID
// travels in the _watermill_message_uuid header, as with watermill-nats;
// a plain producer's message gets its Nats-Msg-Id, or a new UUID, as its
// UUID. Publishing does not set Nats-Msg-Id: JetStream would drop any
// message whose UUID a producer reused within its duplicate window.
//
// # Connections
//
// Start-up retries the connection with backoff until dial_timeout (NATS
// refuses connections while it starts); a refused credential fails at once
// with a *framework.AuthError. framework/consumer's StartupTimeout does not
// reach NATS: set dial_timeout. Once connected, nats.go
// reconnects forever and resubscribes; the subscriber's IsConnected feeds
// /healthz (observe.SubscriberConnected) meanwhile. Acks lost with a
// connection come back as redeliveries after ack_wait, which the claim
// records as duplicates.
//
// # Why not watermill-nats's subscriber
//
// watermill-nats v2.1.3's JetStream subscriber closes its output channel
// while a callback may still send (a "send on closed channel" panic at
// shutdown), lets nats.go ack when the callback returns unless ManualAck,
// deletes the durable its subscription created when it ends, never acks
// or nacks a message it cannot unmarshal (so it comes back every AckWait
// instead of reaching the poison topic), and is push-based, so a queued
// message is redelivered beside its first copy (found by the loyalty
// SIGTERM test in batch mode). Its pkg/jetstream subscriber (beta) has the
// same close race, and its publisher publishes to the stream's name, which
// cannot hold the '.' of TOPIC.poison. docs/adapters.md has the details.
package nats
