package framework

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/internal/kafkarecord"
)

// TimeFunc reads the producer's event time of a message: when the event
// happened, as fixed by the producer, never when this copy was delivered.
// Like a KeyFunc it must return the same value on every redelivery,
// republish and dead-letter replay, because two things depend on it:
//
//   - the expiry guard compares it with the retention horizon to refuse
//     messages whose claim may already be gone;
//   - in partitioned mode it picks the claim's partition (its UTC day), so
//     twins always meet in the same partition and conflict there.
//
// Time specs (ParseTimeSpec, Registry.ParseTime) build the usual ones. A
// TimeFunc that cannot read a time returns an *EventTimeError; such
// messages are poisoned, not retried.
type TimeFunc func(*message.Message) (time.Time, error)

// EventTimeError explains why a message's event time could not be read:
// the field is missing, empty, or not a time. It is permanent: redelivering
// the same message cannot fix it.
type EventTimeError struct {
	// Source names where the time was looked for, e.g. `metadata "event_time"`.
	Source string
	// Reason is a short, human-readable explanation.
	Reason string
}

func (e *EventTimeError) Error() string {
	return fmt.Sprintf("claimtx: invalid event time from %s: %s", e.Source, e.Reason)
}

func (e *EventTimeError) permanent() {}

// Event times at or before minEventTime (Unix 0 is what an unset field
// becomes) or after maxEventTime are refused: they are producer bugs, and
// the bounds keep every accepted time representable as a Postgres date.
var (
	minEventTime = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	maxEventTime = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)
)

// timeFromMetadata reads the event time from one metadata field (an AMQP
// header, a Kafka record header): spec "metadata:NAME". See parseEventTime
// for the accepted forms.
func timeFromMetadata(field string) (TimeFunc, error) {
	if field == "" {
		return nil, &ConfigError{Field: "event_time", Reason: "metadata field name is empty"}
	}
	src := fmt.Sprintf("metadata %q", field)
	return func(msg *message.Message) (time.Time, error) {
		v, ok := msg.Metadata[field]
		if !ok {
			return time.Time{}, &EventTimeError{Source: src, Reason: "field is missing"}
		}
		t, err := parseEventTime(v)
		if err != nil {
			return time.Time{}, &EventTimeError{Source: src, Reason: err.Error()}
		}
		return t, nil
	}, nil
}

// timeFromJSON reads the event time from a field of the JSON payload,
// addressed by a dotted path as in json: key specs ("occurred_at",
// "meta.created"): spec "json:PATH". The field is an RFC 3339 string or a
// Unix time number (see parseEventTime).
func timeFromJSON(path string) (TimeFunc, error) {
	segs, err := parsePath(path)
	if err != nil {
		return nil, &ConfigError{Field: "event_time", Reason: fmt.Sprintf("JSON path %q is invalid", path), Err: err}
	}
	src := fmt.Sprintf("payload %q", path)
	fp := newFieldPaths(segs)
	return func(msg *message.Message) (time.Time, error) {
		var out [1]fieldValue
		payloadValues(msg.Payload, fp, out[:])
		return eventTimeValue(out[0], src)
	}, nil
}

// eventTimeValue reads what a payload path led to as an event time.
func eventTimeValue(f fieldValue, src string) (time.Time, error) {
	if f.reason != "" {
		return time.Time{}, &EventTimeError{Source: src, Reason: f.reason}
	}
	var t time.Time
	var err error
	switch v := f.v.(type) {
	case string:
		t, err = parseEventTime(v)
	case json.Number:
		t, err = parseUnixNumber(string(v))
	default:
		return time.Time{}, &EventTimeError{Source: src, Reason: fmt.Sprintf("field is %s, want an RFC 3339 string or a Unix time number", jsonType(v))}
	}
	if err != nil {
		return time.Time{}, &EventTimeError{Source: src, Reason: err.Error()}
	}
	return t, nil
}

// timeFromKafka reads the Kafka record timestamp that claimtx's Kafka
// adapter puts in metadata (brokers/kafka.MetadataTimestamp). The only
// argument accepted is "timestamp" (spec "kafka:timestamp"). The record timestamp is
// the producer's create time unless the topic uses LogAppendTime, in which
// case it is the broker's append time: stable across redeliveries of one
// record either way. It belongs to the record, not the event: claimtx's
// Kafka publisher copies it onto the records it republishes (poison copies,
// relays), but a LogAppendTime topic or any other producer stamps a copy
// anew. That is why middleware.Claim refuses it for routing claims into
// event-day partitions unless AllowBrokerEventTime is set; prefer a field
// the producer wrote (metadata:, json:).
func timeFromKafka(arg string) (TimeFunc, error) {
	if arg != "" && arg != "timestamp" {
		return nil, &ConfigError{Field: "event_time", Reason: fmt.Sprintf("kafka event time %q is not supported (use kafka:timestamp)", arg)}
	}
	return timeFromMetadata(kafkarecord.KafkaTimestamp)
}

// parseEventTime parses the textual forms producers use for event times:
//
//   - RFC 3339, with or without fractional seconds and with any offset
//     ("2024-05-01T10:00:00Z", "2024-05-01T12:00:00.5+02:00");
//   - a Unix time as a decimal integer, whose unit is inferred from its
//     magnitude: below 1e11 seconds, below 1e14 milliseconds, below 1e17
//     microseconds, else nanoseconds (so any time from 1973 to 5138 is
//     read in the unit it was written in);
//   - a Unix time in seconds with a fraction ("1714557600.25").
//
// The result is in UTC. Times up to Unix 0 (1970-01-01, what an unset
// field becomes) or after 9999 are refused. The inference is
// deterministic, so a redelivery always yields the same time.
func parseEventTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, errors.New("field is empty")
	}
	if c := s[0]; c >= '0' && c <= '9' && !strings.ContainsAny(s, "-:T") {
		return parseUnixNumber(s)
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither RFC 3339 nor a Unix time", s)
	}
	return checkEventTime(t.UTC())
}

// maxUnixNumberBytes bounds the text of a Unix time number. Nanosecond
// precision needs 20 digits; the bound leaves room for zeros and an
// exponent, and keeps a hostile number away from big.Rat, whose cost grows
// with the square of the digits (a million took seconds).
const maxUnixNumberBytes = 64

// parseUnixNumber reads a JSON number or a digit string as a Unix time.
func parseUnixNumber(s string) (time.Time, error) {
	if len(s) > maxUnixNumberBytes {
		return time.Time{}, fmt.Errorf("unix time number is %d bytes, longer than the limit of %d", len(s), maxUnixNumberBytes)
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return time.Time{}, fmt.Errorf("unix time %s is negative", s)
		}
		var t time.Time
		switch {
		case n < 1e11:
			t = time.Unix(n, 0)
		case n < 1e14:
			t = time.UnixMilli(n)
		case n < 1e17:
			t = time.UnixMicro(n)
		default:
			t = time.Unix(0, n)
		}
		return checkEventTime(t.UTC())
	}
	// Fractional (or exponent) forms are seconds. big.Rat keeps every digit
	// so that the same text always gives the same nanosecond.
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		// big.Rat would expand 1e999999999 into a gigabyte of digits.
		exp, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
		if err != nil || exp > 30 || exp < -30 {
			return time.Time{}, fmt.Errorf("%q is not a Unix time", s)
		}
	}
	var r big.Rat
	if _, ok := r.SetString(s); !ok {
		return time.Time{}, fmt.Errorf("%q is not a Unix time", s)
	}
	if r.Sign() < 0 {
		return time.Time{}, fmt.Errorf("unix time %s is negative", s)
	}
	f, _ := r.Float64()
	if f >= 1e11 || math.IsInf(f, 0) {
		return time.Time{}, fmt.Errorf("fractional unix time %s must be in seconds", s)
	}
	ns := new(big.Rat).Mul(&r, big.NewRat(1e9, 1))
	q := new(big.Int).Quo(ns.Num(), ns.Denom())
	return checkEventTime(time.Unix(0, q.Int64()).UTC())
}

func checkEventTime(t time.Time) (time.Time, error) {
	if !t.After(minEventTime) || t.After(maxEventTime) {
		return time.Time{}, fmt.Errorf("%s is outside 1970..9999", t.Format(time.RFC3339Nano))
	}
	return t, nil
}
