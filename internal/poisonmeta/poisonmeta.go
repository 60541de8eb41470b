// Package poisonmeta names the metadata a poisoned copy carries: the keys
// the Poison middleware writes and the dead-letter tooling (internal/dlq,
// `claimtx dlq`) reads and, when it replays a copy, removes again.
package poisonmeta

import (
	"strings"
	"time"

	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// claimtx's own keys. middleware.PoisonReasonKey re-exports Reason.
const (
	// Reason is the error text that poisoned the message.
	Reason = "claimtx_poison_reason"
	// Permanent is "true" when the error was permanent (bad key,
	// undecodable payload), "false" when retries were exhausted.
	Permanent = "claimtx_poison_permanent"
	// Consumer is the consumer name whose handler poisoned the message: a
	// poison destination shared by several consumers of one topic holds
	// copies of each.
	Consumer = "claimtx_poison_consumer"
	// Key is the claim key of the message (after the key policy), absent
	// when it could not be derived, which is often why it was poisoned.
	Key = "claimtx_poison_key"
	// PoisonedAt is when the copy was made, TimeLayout in UTC.
	PoisonedAt = "claimtx_poisoned_at"
)

// Watermill's keys, written too so Watermill's own tooling reads them.
const (
	WatermillReason     = wmw.ReasonForPoisonedKey  // "reason_poisoned"
	WatermillTopic      = wmw.PoisonedTopicKey      // "topic_poisoned": the topic it was consumed from
	WatermillHandler    = wmw.PoisonedHandlerKey    // "handler_poisoned"
	WatermillSubscriber = wmw.PoisonedSubscriberKey // "subscriber_poisoned"
)

// TimeLayout is RFC 3339 with nanoseconds always written out (nine digits),
// so the values of one destination sort as text in time order, and
// time.RFC3339Nano parses them.
const TimeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// FormatTime renders t for PoisonedAt.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeLayout) }

// IsPoisonKey reports whether key is poison bookkeeping rather than the
// message's own metadata: claimtx's claimtx_poison* keys and Watermill's
// four *_poisoned keys (exactly those: a producer's own "…_poisoned" entry
// is the message's). A replay removes exactly these and keeps everything
// else (event id, key fields, event time, traceparent, …).
func IsPoisonKey(key string) bool {
	switch key {
	case WatermillReason, WatermillTopic, WatermillHandler, WatermillSubscriber:
		return true
	}
	return strings.HasPrefix(key, "claimtx_poison")
}
