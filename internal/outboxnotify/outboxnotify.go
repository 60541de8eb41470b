// Package outboxnotify names the LISTEN/NOTIFY channel Store.Enqueue
// notifies on commit and the payload of those notifications, so the relay
// (store/outbox) wakes at once instead of waiting for its next poll, and
// tells its own outbox's notifications from those of other schemas
// listening on the same database.
package outboxnotify

// Channel is the channel Enqueue notifies and relays listen on.
const Channel = "claimtx_outbox"

// Payload is the notification payload for the outbox table in schema.
func Payload(schema, table string) string { return schema + "." + table }
