// Package amqp is claimtx's RabbitMQ adapter: amqp091-go consumers and
// watermill-amqp v3's connection and confirm-mode publisher, configured for
// at-least-once consumption of durable queues.
//
//	sub, err := amqp.NewSubscriber(ctx, brokers.AMQPConfig{URL: url, Concurrency: 8}, logger)
//	msgs, err := sub.Subscribe(ctx, "orders")
//
// Most users import it for its side effect, which registers the kind
// "amqp", and build it through brokers.NewSubscriber. An invalid
// brokers.AMQPConfig is a *framework.ConfigError naming the field.
//
// # Topology
//
// One durable queue per topic, named like the topic, fed by the default
// exchange with routing key = topic, so a plain producer reaches a
// subscription to "orders" by publishing to exchange "" with routing key
// "orders". Subscribe, SubscribeInitialize and the first Publish to a
// topic declare the queue (RabbitMQ drops a message routed to no queue),
// always with QueueType, DeliveryLimit and QueueArguments, which must match
// an existing queue's. Messages are published persistent with publisher
// confirms, on a pool of PublishChannels channels.
//
// # Concurrency, prefetch and the window
//
// Without a window a consumer handles one delivery at a time, as a
// watermill-amqp subscription does, so Subscribe opens Concurrency
// consumers (one channel each) on the queue and merges them: order is not
// kept when Concurrency > 1. Prefetch defaults to 1: more only parks
// messages where other instances cannot take them.
//
// With Window > 0 (batch consumers need workers × batch size), Subscribe
// starts one consumer with prefetch = Window that forwards each delivery
// without waiting for earlier acks (Concurrency and Prefetch are unused).
// Every message is acked on its delivery's channel (tags are per channel).
// Acks are coalesced into AMQP "multiple" acks over the acked front of the
// window; an ack behind a delivery still in progress goes out alone after
// at most 500µs. When a channel or the connection is lost its unacked
// deliveries go back to the queue, late acks of them do nothing, and the
// consumer resumes on a new channel with the Reconnect* backoff.
//
// # Nack
//
// watermill-amqp nacks with requeue and RabbitMQ puts the message back at
// the head of the queue at once, so a failing message would spin as fast as
// the network allows. This adapter holds a nack for NackDelay (1s) first;
// meanwhile that consumer (in the window mode, that message's slot) takes
// nothing else. In claimtx a nack only reaches the broker when even the
// poison queue could not be written: an infrastructure problem, where
// waiting is right. No dead-letter exchange: NoRequeueOnNack drops the
// message without one, and adding x-dead-letter-exchange to an existing
// queue makes every redeclaration fail (PRECONDITION_FAILED).
//
// # Quorum queues
//
// QueueType "quorum" declares every queue, poison queues included, as a
// quorum queue; x-delivery-count arrives as metadata and is not
// republished. DeliveryLimit and how the poison path acts before it:
// docs/reliability.md, "Quorum queues and their delivery limit". A queue
// redeclared with other arguments (406 PRECONDITION_FAILED) is a
// *framework.ConfigError naming the setting and how to migrate.
//
// # Headers and metadata
//
// watermill-amqp's DefaultMarshaler rejects any header that is not a
// string, such as RabbitMQ's x-death, and the delivery is requeued and comes
// straight back: a dead-letter queue replayed through it loops forever.
// This adapter accepts every AMQP field type: a string (or a valid UTF-8
// byte array) is copied as it is, anything else becomes its JSON encoding
// (tables as objects, timestamps as RFC 3339, []byte as base64, Decimal as
// {"scale":s,"value":v}, NaN and ±Inf as strings). Republished, such a
// value goes out as that string.
//
// The UUID comes from the "_watermill_message_uuid" header, else the
// message-id property, else a new one. The amqp_* delivery metadata
// (docs/configuration.md, "Delivery metadata") is never republished.
//
// # Start-up and reconnection
//
// NewSubscriber and NewPublisher retry the first connection with
// exponential backoff until DialTimeout or their context ends (a *DialError);
// refused credentials or vhost (403) fail at once. Once connected,
// watermill-amqp reconnects forever; meanwhile Publish fails with "not
// connected" (the outbox relay retries) and Subscribe waits up to
// DialTimeout. watermill-amqp v3.0.2 replaces its "connected" channel
// without a lock on reconnect, which -race reports whenever a connection
// drops, Subscriber.IsConnected included: the tests that cut connections
// (TestReconnect, framework/observe's TestHealthReconnectAMQP) run only
// without -race, and cut only their own.
//
// # Closing
//
// Close, or the end of a Subscribe context, sends the acks already given
// and closes the channels: whatever is unacked goes back to the queue, and
// its redelivery is claimed as a duplicate. Close leaves no connection
// behind, though v3.0.2's watcher may reconnect once while the wrapper
// closes (see conn).
package amqp
