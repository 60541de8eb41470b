package pg

// OutboxChannel and OutboxPayload name the LISTEN/NOTIFY channel Store.Enqueue
// notifies on commit and the payload of those notifications, so the relay
// (store/outbox) wakes at once instead of waiting for its next poll, and
// tells its own outbox's notifications from those of other schemas
// listening on the same database.

// OutboxChannel is the channel Enqueue notifies and relays listen on.
const OutboxChannel = "claimtx_outbox"

// OutboxPayload is the notification payload for the outbox table in schema.
func OutboxPayload(schema, table string) string { return schema + "." + table }

// MaxOutboxTopicBytes bounds outbox topic names. Brokers have their own
// limits (RabbitMQ queue names: 255 bytes; Kafka topics: 249).
const MaxOutboxTopicBytes = 255
