// Package outboxnotify names the payload of the notifications Store.Enqueue
// sends on store.OutboxChannel, so the relay (store/outbox) can tell its own
// outbox's from those of other schemas listening on the same database.
package outboxnotify

// Payload is the notification payload for the outbox table in schema.
func Payload(schema, table string) string { return schema + "." + table }
