// Package nats is claimtx's NATS JetStream adapter. Like brokers/amqp and
// brokers/kafka it has NewSubscriber and NewPublisher over a typed
// brokers.NATSConfig, and importing it registers the "nats" kind:
//
//	import _ "github.com/claimtx/claimtx/brokers/nats"
//
//	cfg, err := brokers.LoadConfig("") // BROKER=nats NATS_URL=... NATS_DURABLE=billing
//	...
//	sub, err := brokers.NewSubscriber(cfg, logger)
//
// Its registration uses only the public brokers.Factory and
// brokers.Register API, like an adapter of your own: it is the worked
// example of docs/adapters.md, which maps JetStream's ack, nack, redelivery
// and shutdown onto claimtx. Every setting, its default and its trade-off:
// brokers.NATSConfig and docs/configuration.md. Publishing is
// watermill-nats v2's JetStream publisher; consuming is this package's own
// subscriber on nats.go, with watermill-nats's wire format.
//
// There is no default durable, for the reason Kafka has no default consumer
// group: two services sharing one would split the messages.
// framework/consumer sets it to the consumer's Name when that is a durable
// name; the replicas of a service share it.
//
// # Subjects and streams
//
// A topic is the subject subject_prefix + topic. Subscribe and Publish use
// any stream that captures the subject (an operator's "orders.>" included).
// When none does, streams: create makes one named after the subject ('.'
// and other characters a name cannot hold become '_'), capturing that
// subject, with file storage and limits retention and no limits: set max
// age or size as you would a Kafka retention (ReplayHorizon reports the max
// age). Not interest retention, which drops what is published while no
// consumer exists, nor a work queue, which allows one consumer per subject.
// TOPIC.poison gets a stream of its own. streams: require creates nothing
// and fails naming the subject.
//
// Subscribe creates the durable pull consumer (explicit acks, ack_wait,
// max_deliver, max_ack_pending, from the start of the stream) or checks an
// existing one and updates those limits. The adapter creates it because
// nats.go deletes a consumer its subscription created when that
// subscription ends, under the other replicas.
//
// # Delivery
//
// Each worker pulls one message and holds it until the router acks
// (AckSync) or nacks it (NakWithDelay: the server redelivers later);
// meanwhile it signals in-progress every ack_wait/2, so ack_wait only bounds
// how long a dead consumer's messages wait. Poison is claimtx's (a copy to
// TOPIC.poison, then ack), never Term, which drops. An ending subscription
// naks what its workers hold without delay; after a SIGKILL it comes back
// after ack_wait. max_ack_pending counts across all replicas: keep it at
// or above replicas × concurrency. JetStream holds at most 512 waiting
// pulls per consumer; workers beyond that retry.
//
// At max_deliver JetStream stops redelivering silently (an advisory, no
// dead letter; TestMaxDeliverGivesUpSilently). claimtx's redeliveries come
// from outages, crashes and shutdowns, never from a bad message (poisoned
// within one delivery), so a limit turns an outage into lost messages: the
// default is -1, unlimited.
//
// # Metadata
//
// Headers arrive as metadata (several values joined with ", "); the nats_*
// delivery metadata (docs/configuration.md, "Delivery metadata") and a
// producer's Nats-Expected-* headers are never republished. Publishing, a
// metadata key that is not an HTTP token is an error. The UUID travels in
// _watermill_message_uuid (else Nats-Msg-Id, else a new one); publishing
// sets no Nats-Msg-Id, as JetStream would drop a message whose UUID a
// producer reused.
//
// # Connections
//
// Start-up retries until dial_timeout (framework/consumer's StartupTimeout
// does not reach NATS); a refused credential is a *framework.AuthError at
// once. Once connected, nats.go reconnects forever; IsConnected feeds
// /healthz meanwhile, and acks lost with a connection come back as
// redeliveries after ack_wait, recorded as duplicates.
package nats
