package dlq

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
	"github.com/claimtx/claimtx/internal/poison"
)

// Fingerprint is the claim fingerprint of payload: the first 16 bytes of
// its SHA-256, as the claim middleware stores it.
func Fingerprint(payload []byte) []byte {
	sum := sha256.Sum256(payload)
	return sum[:16]
}

// Class is what a dead letter is with respect to its claim.
type Class string

// Classes.
const (
	ClassApplied    Class = "already-applied" // a claim exists: replaying it is a harmless duplicate
	ClassWouldApply Class = "would-apply"     // no claim: replaying it applies it
	ClassStillBad   Class = "still-bad"       // today's key spec cannot key it: it would be poisoned again
	ClassMemo       Class = "poison-memo"     // no claim, but a poison memo (issue #15 part 2)
)

// Match compares a message's fingerprint with its claim's.
type Match string

// Matches.
const (
	MatchSame       Match = "same"
	MatchDifferent  Match = "different"  // same key, different payload: a producer or key-derivation bug
	MatchUnrecorded Match = "unrecorded" // the claim has no fingerprint (Claim.Fingerprint off)
)

// Action is what a replay does, or did, with a message.
type Action string

// Actions.
const (
	// ActionReplay: republished, then removed (or passed by the Kafka
	// progress).
	ActionReplay Action = "replay"
	// ActionPass: nothing to come back for (already applied, another
	// consumer's or topic's copy): the Kafka progress moves past it.
	ActionPass Action = "pass"
	// ActionKeep: left for a later run (still bad, filtered out, past the
	// limit): the Kafka progress of its partition stops before it.
	ActionKeep Action = "keep"
)

// Stamps are the poison metadata of a copy (see middleware.Poison).
type Stamps struct {
	Reason     string
	Permanent  string // "true", "false" or "" (not stamped)
	Consumer   string
	Key        string
	Topic      string // the topic it was consumed from
	Handler    string
	PoisonedAt time.Time // zero when not stamped
}

func stampsOf(md message.Metadata) Stamps {
	s := Stamps{
		Reason:    cmp.Or(md.Get(poison.Reason), md.Get(poison.WatermillReason)),
		Permanent: md.Get(poison.Permanent),
		Consumer:  md.Get(poison.Consumer),
		Key:       md.Get(poison.Key),
		Topic:     md.Get(poison.WatermillTopic),
		Handler:   md.Get(poison.WatermillHandler),
	}
	if t, err := time.Parse(time.RFC3339Nano, md.Get(poison.PoisonedAt)); err == nil {
		s.PoisonedAt = t.UTC()
	}
	return s
}

// Letter is one message of a poison destination.
type Letter struct {
	// Msg is the message as a consumer of the destination sees it, broker
	// metadata (amqp_*, kafka_*, nats_*) included.
	Msg *message.Message
	// Position: "#12" (the 12th of this RabbitMQ browse, the NATS stream
	// sequence) or "2@1041" (Kafka partition 2, offset 1041).
	Position  string
	Partition int32 // Kafka
	Offset    int64 // Kafka
	// Handled: a previous replay of the consumer went past it (Kafka).
	Handled bool
	Stamps  Stamps

	// Set by a Classifier.
	Key    string // the key today's spec derives ("" when it cannot)
	KeyErr error  // why it cannot
	Class  Class
	Match  Match // for ClassApplied

	// Set by Browse and Replay.
	Selected bool // matched the consumer, topic and filters
	Action   Action
	Why      string // why it is passed or kept
	Replayed bool   // the broker confirmed the republished copy
	// CopyOf is the Position of an earlier letter of this run that is the
	// same message (key, or UUID, and payload): a consumer that dies
	// between poisoning and its ack poisons it twice. A replay sends the
	// first copy only.
	CopyOf string

	raw any // *amqp091.Delivery, *kgo.Record or *jetstream.RawStreamMsg
}

// Fingerprint is the claim fingerprint of the letter's payload.
func (l *Letter) Fingerprint() []byte { return Fingerprint(l.Msg.Payload) }

// FingerprintHex is Fingerprint in hex.
func (l *Letter) FingerprintHex() string { return hex.EncodeToString(l.Fingerprint()) }

// Shown is l's key and reason as the pages and the CLI show them: with
// why today's spec cannot key it, when it cannot.
func (l *Letter) Shown() (key, reason string) {
	if l.KeyErr != nil {
		return "(none)", "today: " + l.KeyErr.Error() + "; poisoned: " + l.Stamps.Reason
	}
	return EffectiveKey(l), l.Stamps.Reason
}

// Age is how long ago the copy was poisoned, if it says.
func (l *Letter) Age(now time.Time) (time.Duration, bool) {
	if l.Stamps.PoisonedAt.IsZero() {
		return 0, false
	}
	return now.Sub(l.Stamps.PoisonedAt), true
}

// ShownAge is Age as the pages and the CLI show it: "?" when unknown.
func (l *Letter) ShownAge(now time.Time) string {
	if a, ok := l.Age(now); ok {
		return opfmt.Age(a)
	}
	return "?"
}
