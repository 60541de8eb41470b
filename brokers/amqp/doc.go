// Package amqp is claimtx's RabbitMQ adapter: amqp091-go consumers and
// watermill-amqp v3's connection and confirm-mode publisher, configured for
// at-least-once consumption of durable queues, with the sharp edges of that
// stack filed off.
//
//	sub, err := amqp.NewSubscriber(ctx, amqp.Config{URL: url, Concurrency: 8}, logger)
//	msgs, err := sub.Subscribe(ctx, "orders")
//
// Most users import it for its side effect, which registers the kind
// "amqp", and build it through brokers.NewSubscriber. Every
// brokers.AMQPConfig field documents its default; an invalid brokers.AMQPConfig is a
// *framework.ConfigError naming the field by its YAML key ("url",
// "window").
//
// # Topology
//
// One durable queue per topic, named exactly like the topic, fed by the
// default exchange with routing key = topic. A producer that knows nothing of
// Watermill (amqp091-go, pika, the management UI) reaches a subscription to
// "orders" by publishing to exchange "" with routing key "orders". Subscribe,
// SubscribeInitialize and the first Publish to a topic declare the queue
// (RabbitMQ drops a message routed to a queue that does not exist, so the
// publisher declares it too). brokers.AMQPConfig.QueueType, brokers.AMQPConfig.DeliveryLimit and
// brokers.AMQPConfig.QueueArguments are passed on every declaration and must match an
// existing queue's arguments.
//
// Messages are published persistent, with publisher confirms: Publish returns
// nil only after RabbitMQ confirmed every message. The confirm-mode channels
// are pooled (brokers.AMQPConfig.PublishChannels).
//
// # Concurrency and prefetch
//
// Without a window, each consumer handles one delivery at a time, as a
// watermill-amqp subscription does: it hands a message to its channel and
// waits for the ack before it takes the next. So Subscribe opens
// brokers.AMQPConfig.Concurrency consumers (one AMQP channel each) on the same queue and
// merges them into the one channel it returns; RabbitMQ spreads deliveries
// over them, and up to Concurrency messages are in the handler at once.
// Order is therefore not kept when Concurrency > 1.
//
// Prefetch (QoS) is per channel and defaults to 1, which is exactly what a
// sequential subscription can use: a higher prefetch only parks messages in
// this process, invisible to other instances, and hands them back as
// "redelivered" after a crash.
//
// # Window mode
//
// A batch consumer (framework/consumer.NewBatch) can only gather as many
// messages as are unacked at once, and Concurrency subscriptions give at
// most Concurrency of them, refilled one ack at a time. With brokers.AMQPConfig.Window
// > 0, Subscribe instead starts ONE amqp091 consumer on its own channel
// with QoS prefetch = Window and forwards each delivery without waiting for
// the previous ones to be acked: up to Window messages are in flight (set it
// to workers × batch size). Concurrency and Prefetch are not used then.
//
// Both modes declare the queue exactly as the publisher does, and run
// deliveries through the same conversion and the same consumer code, so
// they consume the same queue and yield the same metadata. Every
// message is acked on the channel its delivery came from (delivery tags are
// per channel). Acks are coalesced: an ack that leaves the oldest
// deliveries all acked goes out at once as one AMQP "multiple" ack over
// them, acks arriving while it is written join the next frame, and an ack
// behind a delivery still in progress is sent alone after at most 500µs,
// so a batch costs a few ack frames instead of one per message and no ack
// waits behind a slow message. A nack is held for NackDelay without holding up the other
// messages: only its window slot stays taken. When the channel or the
// connection is lost, its unacked deliveries go back to the queue, late
// acks of them have no effect, and the consumer resumes on a new channel
// once the connection is back (retrying with the Reconnect*
// backoff). Cancelling the context or Close sends the acks already given,
// then closes the channel: everything still unacked goes back to the queue.
//
// # Nack
//
// watermill-amqp's subscriber nacks with requeue=true (subscriber.go:439),
// and RabbitMQ puts the message back at the head of the queue at once: a
// message that keeps failing would spin through the handler as fast as the
// network allows. This adapter holds a nacked delivery for brokers.AMQPConfig.NackDelay
// (default 1s) before handing the nack to RabbitMQ; meanwhile that one
// consumer takes no other message (in the window mode, only that message's
// slot stays taken). In claimtx the router's Retry and Poison middleware sit
// in front of the claim, so a nack only reaches the broker when even the
// poison queue could not be written, which is an infrastructure problem
// where waiting and trying again is the right answer.
//
// Why not a dead-letter exchange: watermill-amqp's one knob,
// ConsumeConfig.NoRequeueOnNack, nacks without requeue, which makes RabbitMQ
// drop the message unless the queue has a dead-letter exchange, and adding
// x-dead-letter-exchange to an existing queue's arguments makes every
// redeclaration fail (PRECONDITION_FAILED). A dead-lettered message also waits
// for an operator to replay it. Requeue with a delay loses nothing and needs
// no topology. If you want RabbitMQ to bound redeliveries as well, use a
// quorum queue with a delivery limit and a dead-letter exchange (see
// "Quorum queues"), and replay the dead-letter queue with this adapter, see
// below.
//
// # Quorum queues
//
// brokers.AMQPConfig.QueueType "quorum" (AMQP_QUEUE_TYPE=quorum, amqp.queue_type)
// declares every queue, the topic's and the poison topic's alike, as a
// quorum queue: RabbitMQ's replicated queue type, the one for durable work
// (classic mirrored queues are gone in RabbitMQ 4). Nothing else changes
// for claimtx: acks, nacks with NackDelay, the window mode and the
// metadata work the same, and the claim deduplicates what a quorum queue
// redelivers as it does for a classic one.
//
// A quorum queue adds an x-delivery-count header to what it delivers: how
// often the message came back to it. Up to RabbitMQ 4.2 every return
// counts: a nack (this adapter nacks with basic.nack, requeue) and an
// unacked delivery of a consumer that died or lost its connection. From
// 4.3 only failed deliveries count (basic.reject, a lost consumer), not a
// basic.nack, and x-acquired-count counts every delivery (RabbitMQ's
// documentation; the local RabbitMQ of the tests is 3.10). The headers
// arrive as metadata like any header ("0", "1", ...), so keys and event
// times derived from the producer's fields never see them, and Marshal
// does not publish them again: a poison copy starts from its own count.
//
// brokers.AMQPConfig.DeliveryLimit (AMQP_DELIVERY_LIMIT, amqp.delivery_limit) sets the
// queue's x-delivery-limit N. The return that takes a message's
// x-delivery-count past N removes it from the queue: without a
// dead-letter exchange RabbitMQ drops it without a trace; with one
// (QueueArguments {x-dead-letter-exchange: "", x-dead-letter-routing-key:
// orders.dlq}) it is dead-lettered with x-death reason "delivery_limit"
// and x-first-death-reason "delivery_limit". TestQuorumDeliveryLimit
// checks both on the local RabbitMQ (3.10): with limit 2 a nacked message
// is delivered 3 times, then dropped or dead-lettered. RabbitMQ 3.13 and
// 4.x document the same drop-or-dead-letter, with two differences: from
// 4.0 a quorum queue without a limit gets the default of 20, and from 4.3
// the nacks of this adapter no longer count (see above), so only crashes
// and lost connections with the message in flight bring it closer to
// the limit.
//
// claimtx's own poison path acts long before the limit: a handler that
// fails is retried in process (framework/consumer's HandlerRetries, with
// backoff, without going back to the broker) and then poisoned with the
// reason, all on one delivery, and a message that cannot be keyed or
// decoded is poisoned at once. What counts against the limit is a crash or
// lost connection with the message in flight and, up to RabbitMQ 4.2, a
// nack (the poison queue could not be written, or a transient database
// failure outlasted the claim's retries). Keep the limit well above the restarts a message may
// live through, or RabbitMQ, not claimtx, decides what happens to it.
//
// A queue's type and arguments are fixed when it is created. Declaring a
// queue that exists with others is refused by RabbitMQ (406
// PRECONDITION_FAILED); Subscribe, SubscribeInitialize and Publish then
// return a *framework.ConfigError naming the setting (queue_type,
// delivery_limit or queue_arguments) and the way out, wrapping RabbitMQ's
// error, which names the argument and both values. To move a classic queue
// to quorum: stop its consumers, let it drain (or move its messages), delete
// it (rabbitmqctl delete_queue NAME), and start the consumers with
// AMQP_QUEUE_TYPE=quorum, which declare it anew; or switch to a new topic.
//
// # Headers and dead-letter replay
//
// When RabbitMQ dead-letters a message it adds an x-death header: an array
// of tables with longs, timestamps and strings. Watermill's DefaultMarshaler
// rejects any header that is not a string (marshaler.go:90); the delivery is
// then nacked with requeue and comes straight back: replaying a dead-letter
// queue through it loops forever. This adapter accepts every AMQP field
// type. Each header becomes the metadata entry of the same name:
//
//   - string: copied as is.
//   - []byte (AMQP byte array): copied as is when it is valid UTF-8,
//     otherwise JSON-encoded (a quoted base64 string).
//   - anything else (bool, integers, floats, Decimal, timestamp, void,
//     nested tables and arrays such as x-death): its JSON encoding, so
//     json.Unmarshal of the entry gives the value back. Within JSON, tables
//     are objects, arrays are arrays, timestamps are RFC 3339 strings,
//     []byte is base64, Decimal is {"scale":s,"value":v}, and the floats
//     NaN, +Inf and -Inf, which JSON cannot hold, are the strings "NaN",
//     "+Inf", "-Inf". An int64 header 3 becomes "3", a bool "true", and
//     x-death `[{"count":1,"reason":"rejected",...}]`.
//
// A value carried as JSON goes back out as that string when the message is
// republished (publishing does not guess types back); RabbitMQ (3.10
// verified) replaces a string x-death with its own array if it
// dead-letters the message again.
//
// # Metadata
//
// A message's UUID comes from the "_watermill_message_uuid" header (shared
// with watermill-amqp), then from the message-id property, and is generated
// when neither is set (a plain producer). The adapter adds these entries,
// which key and event-time specs can read by name ("metadata:amqp_timestamp"),
// without overwriting a header of the same name:
//
//	amqp_message_id              the message-id property
//	amqp_correlation_id          the correlation-id property
//	amqp_content_type            the content-type property
//	amqp_timestamp               the timestamp property, RFC 3339, UTC; absent when unset
//	amqp_exchange                the exchange it was published to ("" = the default exchange)
//	amqp_routing_key             the routing key it was published with
//	_watermill_amqp_redelivered  "true" when RabbitMQ flags the delivery as redelivered
//
// They describe one delivery, so none of them is published again (a copy
// of a consumed message's metadata does not carry them along), and none
// should be a claim key: they change on republish and replay. Publishing
// sends every other metadata entry as a string header, the UUID in the
// UUID header and as the message-id property, and marks the message
// persistent.
//
// # Start-up and reconnection
//
// watermill-amqp dials once when a subscriber or publisher is created and
// fails if RabbitMQ is not up yet (connection.go:44). NewSubscriber and
// NewPublisher retry with exponential backoff
// (ReconnectInitialInterval doubling to ReconnectMaxInterval) until they
// connect, brokers.AMQPConfig.DialTimeout passes, or their context ends, and then return a
// *DialError with the attempts made and the last error. Refused credentials
// or vhost (AMQP 403) are returned at once: waiting will not fix them.
//
// Once connected, watermill-amqp reconnects by itself, forever, and the
// consumers resume on new channels. While it is reconnecting its Publish fails with "not
// connected" (publisher.go:102): publishers must retry (claimtx's outbox
// relay does). Subscribe waits for the connection, bounded by DialTimeout.
// Note that watermill-amqp v3.0.2 replaces its "connected" channel without a
// lock on reconnect (connection.go:139, read at connection.go:114), which the
// race detector reports whenever a connection drops under -race; the same
// read happens in Subscriber.IsConnected, so a readiness probe during a
// reconnect is reported too. TestReconnect therefore runs only without -race;
// it closes only its own connections (rabbitmqctl close_connection, matched
// by brokers.AMQPConfig.ConnectionName), so it does not disturb other tests on the same
// RabbitMQ. framework/observe's TestHealthReconnectAMQP, for the same reason,
// runs without -race and cuts only its own connection (through a TCP proxy
// it owns).
//
// # Closing
//
// Close stops every subscription; messages not yet acked go back to their
// queue (nack with requeue), so a handler that finishes after Close has its
// effect claimed and the redelivery recorded as a duplicate. Cancelling the
// Subscribe context does the same for that subscription.
//
// Subscriber.Close and Publisher.Close leave no connection behind. In
// v3.0.2, watermill-amqp's connection watcher reconnects when it sees the
// connection's close notification before its own stop signal, which happens
// when the wrapper is closed right after it was made, or while it waits to
// retry a lost connection; that new connection was never closed. Close
// waits for the watcher to end (up to 5 s; it ends at once, or after that
// one reconnect) and closes the connection it left. Closed while the
// connection is lost, Close does not wait for the next retry (up to
// ReconnectMaxInterval away): the connection that retry may make is closed
// in the background.
package amqp
