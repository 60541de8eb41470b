package framework

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/internal/kafkarecord"
)

// TimeFunc reads a message's event time: when the event happened, as the
// producer fixed it, never when this copy was delivered. Like a KeyFunc it
// must give the same value on every redelivery, republish and replay: the
// expiry guard compares it with the retention horizon, and in partitioned
// mode its UTC day picks the claim's partition, where twins must meet.
//
// Time specs (ParseTimeSpec, Registry.ParseTime) build the usual ones. A
// TimeFunc that cannot read a time returns an *EventTimeError; such
// messages are poisoned, not retried.
type TimeFunc func(*message.Message) (time.Time, error)

// EventTimeError explains why a message's event time could not be read
// (missing, empty, not a time). It is permanent.
type EventTimeError struct {
	Source string // where the time was looked for, e.g. `metadata "event_time"`
	Reason string
}

func (e *EventTimeError) Error() string {
	return fmt.Sprintf("claimtx: invalid event time from %s: %s", e.Source, e.Reason)
}

func (e *EventTimeError) permanent() {}

// Event times up to Unix 0 (what an unset field becomes) or after 9999 are
// producer bugs; the bounds keep every time a Postgres date.
var (
	minEventTime = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	maxEventTime = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)
)

// timeFromMetadata is spec "metadata:NAME".
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

// timeFromJSON is spec "json:PATH", as in key specs, to an RFC 3339 string
// or a Unix time number.
func timeFromJSON(path string) (TimeFunc, error) {
	f, err := payloadFunc(path, eventTimeValue)
	if err != nil {
		return nil, &ConfigError{Field: "event_time", Reason: fmt.Sprintf("JSON path %q is invalid", path), Err: err}
	}
	return f, nil
}

func eventTimeValue(f fieldValue, src string) (t time.Time, err error) {
	switch v := f.v.(type) {
	case string:
		t, err = parseEventTime(v)
	case json.Number:
		t, err = parseUnixNumber(string(v))
	default: // nil too when f.reason tells why there is no value
		if f.reason == "" {
			f.reason = fmt.Sprintf("field is %s, want an RFC 3339 string or a Unix time number", jsonType(v))
		}
		err = errors.New(f.reason)
	}
	if err != nil {
		return time.Time{}, &EventTimeError{Source: src, Reason: err.Error()}
	}
	return t, nil
}

// timeFromKafka is spec "kafka:timestamp", the record timestamp the Kafka
// adapter puts in metadata; why middleware.Claim refuses it for event-day
// partitions: docs/design.md, "Event time" (a copy may be restamped).
func timeFromKafka(arg string) (TimeFunc, error) {
	if arg != "" && arg != "timestamp" {
		return nil, &ConfigError{Field: "event_time", Reason: fmt.Sprintf("kafka event time %q is not supported (use kafka:timestamp)", arg)}
	}
	return timeFromMetadata(kafkarecord.KafkaTimestamp)
}

// parseEventTime reads RFC 3339 (any offset, optional fraction) or a Unix
// time (parseUnixNumber), in UTC.
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

const maxUnixNumberBytes = 64 // nanoseconds need 20 digits; big.Rat is quadratic in them

// parseUnixNumber reads a Unix time: an integer's unit is inferred from its
// magnitude (below 1e11 seconds, 1e14 milliseconds, 1e17 microseconds, else
// nanoseconds: any time from 1973 to 5138 in the unit it was written in); a
// fraction or exponent means seconds.
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
	// big.Rat keeps every digit, so one text always gives one nanosecond,
	// but would expand 1e999999999 into a gigabyte of digits.
	if i := strings.IndexAny(s, "eE"); i >= 0 {
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
	if f, _ := r.Float64(); f >= 1e11 { // +Inf too
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
