// Package framework is claimtx's vocabulary: how a message becomes a
// deduplication key and an event time, what can happen to a message
// (Outcome), how a handler reaches the claim transaction, and the errors
// callers branch on. Every other claimtx package speaks it, and your code
// can depend on it without pulling in a broker: besides the standard
// library and claimtx's internal helpers it imports only Watermill's
// message package (extractors read a *message.Message) and pgx, for the
// pgx.Tx that TxFromContext hands a handler. It opens no connection and
// imports no broker client.
//
// A key names one effect, fixed by the producer, the same on every
// redelivery, republish and dead-letter replay: never the broker's delivery
// id, offset or the Watermill UUID. Keys and event times are built from the
// spec strings env and YAML configuration use (metadata:NAME, json:PATH,
// template:TEXT, first:SPEC|SPEC..., kafka:timestamp):
//
//	key, err := framework.ParseKeySpec("template:order-completed:{payload.order_id}")
//	eventTime, err := framework.ParseTimeSpec("json:occurred_at")
//
// A Registry adds named extractors for what a spec cannot say. KeyPolicy
// validates derived keys. Errors are typed (*KeyError, *EventTimeError,
// *ExpiredError, *AuthError, *ConfigError, *PanicError; branch with
// errors.As); Permanent marks an error retrying cannot fix. Nothing in
// claimtx panics on bad configuration.
//
// docs/configuration.md lists the specs, docs/design.md says why keys are
// injective and what bounds keep their derivation linear in the payload,
// docs/operations.md covers event times and the expiry guard.
package framework
