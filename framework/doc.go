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
// # Layers
//
//   - framework (this package): the vocabulary, keys, event times,
//     outcomes, errors.
//   - store (the claim tables) and middleware (the claim, expiry and poison
//     middleware) build on it; so do the broker adapters (brokers/...), for
//     its errors.
//   - framework/consumer is the composition root: it wires a broker, the
//     store and the middleware into a running consumer; framework/observe
//     adds metrics, tracing and readiness to it.
//   - framework/cmd/* are programs (the claimtx CLI, benchmarks) built on
//     the packages above.
//
// # Keys
//
// A key names one effect, fixed by the producer: an event id header, a
// business id in the payload, or a template combining them. It must be the
// same on every redelivery, republish and dead-letter replay, so it is never
// the broker's delivery id, offset or the Watermill UUID.
//
// Keys are built from spec strings, the same ones env and YAML
// configuration use. A spec is NAME:ARG; everything after the first colon
// is the argument:
//
//	metadata:NAME          a metadata field (AMQP header, Kafka record header)
//	json:PATH              a JSON payload field by dotted path: order_id, order.id, items.0.sku
//	template:TEXT          text with {payload.PATH} and {metadata.NAME} placeholders;
//	                       {{ and }} are literal braces
//	first:SPEC|SPEC...     the first alternative that yields a key
//
// For example:
//
//	key, err := framework.ParseKeySpec("metadata:event_id")
//	key, err := framework.ParseKeySpec("json:order.id")
//	key, err := framework.ParseKeySpec("template:order-completed:{payload.order_id}")
//	key, err := framework.ParseKeySpec("template:{metadata.tenant}:{metadata.event_id}")
//	key, err := framework.ParseKeySpec("first:metadata:event_id|json:order_id")
//
// JSON strings are used as they are; numbers are rendered canonically
// (9912, 9912.0 and 9.912e+03 all give "9912"), so a producer that changes
// its JSON encoder does not change keys; booleans give "true"/"false";
// objects, arrays and null cannot be keys. A fixed prefix that keeps the
// keys of different event types apart is a template:
// "template:order-completed:{payload.order_id}".
//
// Distinct values never share a key. In a template, placeholders need a
// separator between them, and the value of every placeholder that another
// one follows has the separator's first character and '\' escaped with '\'
// (tenant "a:b", event "c" give `a\:b:c`). first: keeps keys of its first
// alternative as they are (unless they start with '\') and returns a key k
// of alternative i ≥ 1 as `\i:k`, so event_id "3" and a fallback order_id 3
// differ. Alternatives cannot contain '|' or be first: themselves.
//
// Deriving a key costs time linear in the payload, and JSON lookups are
// bounded: a payload over 4 MiB or nested deeper than 64 levels, or a
// number longer than 512 bytes, cannot be keyed.
//
// KeyPolicy validates derived keys: empty keys, invalid UTF-8, NUL bytes and
// keys over MaxBytes (512 by default) are refused with a *KeyError, or, with
// HashOverlong, long keys are replaced by "sha256:" and their hex SHA-256.
//
// # Event times
//
// A TimeFunc reads when the event happened, as the producer fixed it: the
// expiry guard compares it with the claim retention horizon, and a
// partitioned claim table files the claim under its UTC day. Event-time
// specs:
//
//	metadata:NAME      a metadata field
//	json:PATH          a JSON payload field by dotted path
//	kafka:timestamp    the Kafka record timestamp claimtx's Kafka adapter exposes
//
// Fields hold RFC 3339 ("2024-05-01T10:00:00Z", any offset, any fraction)
// or a Unix time: a decimal integer whose unit is told from its magnitude
// (below 1e11 seconds, below 1e14 milliseconds, below 1e17 microseconds,
// else nanoseconds), or seconds with a fraction ("1714557600.25"). Times up
// to 1970-01-01 (what an unset field becomes) or after 9999 are refused.
// Prefer a time the producer wrote (metadata:, json:) to kafka:timestamp,
// which a copy written again may carry anew.
//
//	eventTime, err := framework.ParseTimeSpec("json:occurred_at")
//
// # Custom extractors
//
// For what a spec cannot say, write a KeyFunc or TimeFunc. To let
// configuration name it, register a factory on a Registry and parse specs
// with that registry; ParseKeySpec and ParseTimeSpec know the built-ins
// only, so no import can change what a spec means elsewhere:
//
//	reg := framework.NewRegistry()
//	err := reg.RegisterKey("tenant-event", func(arg string) (framework.KeyFunc, error) { ... })
//	key, err := reg.ParseKey(os.Getenv("KEY")) // "tenant-event:orders", or any built-in spec
//
// Unknown names fail with a *ConfigError listing the registry's names. A
// consumer takes the registry as consumer.Config.Extractors.
//
// # Outcomes
//
// Outcome is what happened to one delivery: Applied (the effect committed),
// Duplicate (already claimed; acked without running the handler), Failed
// (rolled back and nacked or retried), Poisoned (sent to the poison
// destination with the reason and acked), Expired (older than the claim
// retention horizon; poisoned rather than applied). It is a string so it
// can label metrics.
//
// # Errors callers branch on
//
// Each concept has one typed error; branch on it with errors.As:
//
//	var ke *framework.KeyError        // the message cannot be keyed
//	var te *framework.EventTimeError  // the message has no usable event time
//	var xe *framework.ExpiredError    // the message is older than the retention horizon
//	var ae *framework.AuthError       // a dependency refused the credentials at start-up
//	var ce *framework.ConfigError     // a configuration field is wrong (names the field)
//	var pe *framework.PanicError      // a handler panicked
//	if errors.As(err, &ke) { ... }
//
// Errors that retrying cannot fix are permanent: Permanent(err) marks them,
// IsPermanent detects them, and *KeyError, *EventTimeError and
// *ExpiredError are permanent by construction. The claim middleware does not
// retry them and framework/consumer sends them straight to the poison
// destination with the reason. A handler returns ErrAlreadyApplied when its
// effect's own unique constraint shows the effect already committed. Nothing
// in claimtx panics on bad configuration.
//
// # The claim transaction
//
// Under the claim middleware a handler finds the transaction that holds its
// claim with TxFromContext (or is written as a middleware.TxHandlerFunc that
// receives it, and fails with ErrNoClaimTx when run without one). Every
// write of the effect must go through that transaction. ClaimKey gives it
// the key the message was claimed under, to log or to store beside the
// effect.
package framework
