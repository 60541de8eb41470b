// Package poison is the poison concept's rules: the metadata a poisoned
// copy carries, the bounds of its reason, and what the poison memo
// remembers (memo.go). Its tables' statements, the memo's and the dead
// letters', are store/internal/poisonsql's: every statement lives under
// store/.
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
	// Consumer is the consumer whose handler poisoned the message (a
	// shared poison destination holds copies of each).
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

// TimeLayout is RFC 3339 with all nine digits of nanoseconds, so values
// sort as text in time order; time.RFC3339Nano parses them.
const TimeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// FormatTime renders t for PoisonedAt.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeLayout) }

// IsPoisonKey reports whether key is poison bookkeeping, which a replay
// removes: claimtx's claimtx_poison* keys and exactly Watermill's four
// *_poisoned keys (a producer's own "…_poisoned" entry is the message's).
func IsPoisonKey(key string) bool {
	switch key {
	case WatermillReason, WatermillTopic, WatermillHandler, WatermillSubscriber:
		return true
	}
	return strings.HasPrefix(key, "claimtx_poison")
}

// MaxReasonBytes bounds the reason a poisoned copy carries (in Reason and
// WatermillReason) and a dead-letter row keeps. An error's text has no
// bound of its own (Go's JSON error quotes a number whole): copied twice
// into headers, a 40 kB text made a copy JetStream, RabbitMQ and Kafka
// refuse, and the message came back forever. The whole text is logged
// once, beside the hash the bounded reason ends with.
const MaxReasonBytes = 4096

// ShortReasonBytes bounds the reason of the smaller copy the Poison
// middleware publishes when the broker refused the first one.
const ShortReasonBytes = 256

// minReasonBytes is the least BoundReason keeps: the marker alone.
const minReasonBytes = 128

// BoundReason returns s as a reason of at most limit bytes (at least
// minReasonBytes), made pg.Text, and, when it had to be cut, ending in a
// marker with the length and SHA-256 of the whole text:
//
//	loyalty: bad OrderCompleted event: json: cannot unmarshal number 99999… [truncated: 40104 bytes, sha256:1f0c…]
//
// truncated reports whether it was cut. The length and hash are of s as
// given.
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
// and the log line of a poisoned message write it.
func ReasonHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
