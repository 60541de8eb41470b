// Package framework is claimtx's leaf vocabulary: how a message becomes a
// deduplication key, what can happen to a message (Outcome), how a handler
// reaches the claim transaction, and the errors callers branch on. Its only
// dependencies outside the standard library are Watermill's message
// package (a KeyFunc reads a *message.Message) and pgx, for the pgx.Tx type
// a handler receives (TxFromContext); it imports no pgx pool, no other
// claimtx package and no broker client, so every other package, and your
// own code, can depend on it freely.
//
// # Keys
//
// A key names one effect, fixed by the producer: an event id header, a
// business id in the payload, or a template combining them. It must be the
// same on every redelivery, republish and dead-letter replay, so it is never
// the broker's delivery id, offset or the Watermill UUID.
//
//	key, err := framework.ParseKeySpec("template:order-completed:{payload.order_id}")
//	key, err := framework.ParseKeySpec("metadata:event_id")
//	key, err := framework.FromJSON("order.id")
//
// Built-in spec names are metadata, json and template; RegisterKeyExtractor
// adds your own so configuration can name them. Numbers in payloads are
// rendered canonically (9912, 9912.0 and 9.912e+03 all give "9912"), so a
// producer that changes its JSON encoder does not change keys.
//
// Distinct values never share a key: templates escape their separators
// inside values and refuse adjacent placeholders, and FirstNonEmpty
// namespaces its sources (see Template and FirstNonEmpty). Deriving a key
// costs time linear in the payload, and JSON lookups bound the payload's
// size and nesting (see FromJSON).
//
// KeyPolicy validates derived keys: empty keys, invalid UTF-8, NUL bytes and
// keys over 512 bytes are refused with a *KeyError matching ErrInvalidKey,
// or, with HashOverlong, long keys are replaced by their SHA-256.
//
// # Errors
//
// Errors that retrying cannot fix are permanent: Permanent(err) marks them,
// IsPermanent detects them (key errors are permanent by construction). The
// claim middleware does not retry them and the composed router sends them
// straight to the poison destination with the reason. Configuration errors
// are *ConfigError values naming the field; nothing in claimtx panics on bad
// configuration.
//
// # The claim transaction
//
// Under the claim middleware a handler finds the transaction that holds its
// claim with TxFromContext (or is written as a middleware.TxHandlerFunc that
// receives it). Every write of the effect must go through that transaction.
package framework
