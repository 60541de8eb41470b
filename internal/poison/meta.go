// Package poison is the poison concept in one place: the metadata a
// poisoned copy carries (meta.go: the keys the Poison middleware writes and
// the dead-letter tooling reads and, when it replays a copy, removes again),
// the bounds of its reason, and the poison memo (memo.go: its hit error and
// timeouts; memosql.go: its table). The dead-letter table's SQL is the
// store's (store/internal/deadletter).
package poison

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/claimtx/claimtx/internal/pg"
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

// MaxReasonBytes bounds the reason a poisoned copy carries, in Reason and
// again in WatermillReason, and the reason a dead-letter row keeps. An
// error's text has no bound of its own: Go's JSON error quotes a number
// whole, a panic quotes its value, a driver error its statement. Copied
// twice into headers, a 40 kB text made a copy JetStream refuses (64 KiB of
// headers at most), RabbitMQ closes the connection over (one frame holds
// every header: 128 KiB by default) and Kafka's producer refuses (1 MiB a
// record), and the message came back forever. 4 KiB says what failed; the
// whole text is logged once, beside the hash the bounded reason ends with.
const MaxReasonBytes = 4096

// ShortReasonBytes bounds the reason of the smaller copy the Poison
// middleware publishes when the broker refused the first one.
const ShortReasonBytes = 256

// minReasonBytes is the least BoundReason keeps: the marker alone.
const minReasonBytes = 128

// BoundReason returns s as a reason of at most limit bytes (at least
// minReasonBytes): valid UTF-8 without NUL bytes (invalid sequences and
// NULs become U+FFFD), and, when it had to be cut, ending in a marker with
// the length and SHA-256 of the whole text, so the cut reason can be told
// from a whole one and matched with the logged text:
//
//	loyalty: bad OrderCompleted event: json: cannot unmarshal number 99999… [truncated: 40104 bytes, sha256:1f0c…]
//
// truncated reports whether it was cut. The length and hash are of s as
// given, before any repair.
func BoundReason(s string, limit int) (reason string, truncated bool) {
	limit = max(limit, minReasonBytes)
	clean := pg.Text(s)
	if len(clean) <= limit {
		return clean, false
	}
	marker := fmt.Sprintf("… [truncated: %d bytes, sha256:%s]", len(s), ReasonHash(s))
	cut := limit - len(marker)
	for cut > 0 && !utf8.RuneStart(clean[cut]) {
		cut--
	}
	return clean[:cut] + marker, true
}

// ReasonHash is the hex SHA-256 of a whole reason, as BoundReason's marker
// writes it: what the log line of a poisoned message shows beside the
// whole text, so the two can be matched.
func ReasonHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
