package pg

// OutboxChannel is the channel Enqueue notifies and relays listen on.
const OutboxChannel = "claimtx_outbox"

// OutboxPayload is the notification payload for the outbox table in
// schema, which tells a relay its own outbox's notifications from others'.
func OutboxPayload(schema, table string) string { return schema + "." + table }

// MaxOutboxTopicBytes bounds outbox topic names. Brokers have their own
// limits (RabbitMQ queue names: 255 bytes; Kafka topics: 249).
const MaxOutboxTopicBytes = 255
