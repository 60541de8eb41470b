package framework

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
)

// KeyFunc derives the deduplication key of a message. It must be a pure
// function of what the producer fixed (a metadata field, payload fields), so
// that every redelivery, republish and dead-letter replay of the same logical
// event yields the same key. Never derive it from broker delivery ids,
// offsets or the Watermill UUID: those change on republish.
//
// A KeyFunc that cannot key a message returns an error matching
// ErrInvalidKey (use *KeyError); such messages are poisoned, not retried.
type KeyFunc func(*message.Message) (string, error)

// FromMetadata keys messages by one metadata field (for AMQP, a header; for
// Kafka, a record header), e.g. FromMetadata("event_id").
func FromMetadata(field string) (KeyFunc, error) {
	if field == "" {
		return nil, &ConfigError{Field: "key", Reason: "metadata field name is empty"}
	}
	src := fmt.Sprintf("metadata %q", field)
	return func(msg *message.Message) (string, error) {
		v, ok := msg.Metadata[field]
		if !ok {
			return "", &KeyError{Source: src, Reason: "field is missing"}
		}
		if v == "" {
			return "", &KeyError{Source: src, Reason: "field is empty"}
		}
		return v, nil
	}, nil
}

// FromJSON keys messages by a field of their JSON payload, addressed by a
// dotted path ("order_id", "order.id", "items.0.sku"). Strings are used as
// they are; numbers are rendered canonically so that 9912, 9912.0 and
// 9.912e+03 all give "9912"; booleans give "true"/"false". Objects, arrays
// and null are refused.
func FromJSON(path string) (KeyFunc, error) {
	segs, err := parsePath(path)
	if err != nil {
		return nil, err
	}
	src := fmt.Sprintf("payload %q", path)
	return func(msg *message.Message) (string, error) {
		doc, err := decodePayload(msg.Payload)
		if err != nil {
			return "", &KeyError{Source: src, Reason: err.Error()}
		}
		return lookupJSON(doc, segs, src)
	}, nil
}

// Prefix prepends a fixed namespace to another KeyFunc's key, e.g.
// Prefix("order-completed:", k) so that keys of different event types can
// never collide within one consumer.
func Prefix(prefix string, f KeyFunc) (KeyFunc, error) {
	if f == nil {
		return nil, &ConfigError{Field: "key", Reason: "Prefix needs a non-nil KeyFunc"}
	}
	return func(msg *message.Message) (string, error) {
		k, err := f(msg)
		if err != nil {
			return "", err
		}
		return prefix + k, nil
	}, nil
}

// FirstNonEmpty tries each KeyFunc in order and returns the first key that
// is produced without error, e.g. an event_id header when the producer sets
// one, else the order_id from the payload. When all fail, the error matches
// ErrInvalidKey and lists every reason.
func FirstNonEmpty(fs ...KeyFunc) (KeyFunc, error) {
	if len(fs) == 0 {
		return nil, &ConfigError{Field: "key", Reason: "FirstNonEmpty needs at least one KeyFunc"}
	}
	for i, f := range fs {
		if f == nil {
			return nil, &ConfigError{Field: "key", Reason: fmt.Sprintf("FirstNonEmpty: KeyFunc %d is nil", i)}
		}
	}
	return func(msg *message.Message) (string, error) {
		reasons := make([]string, 0, len(fs))
		for _, f := range fs {
			k, err := f(msg)
			if err == nil && k != "" {
				return k, nil
			}
			if err != nil {
				// A non-key error (a bug in a user extractor, say) must not be
				// masked as "no key": report it as is.
				if !errors.Is(err, ErrInvalidKey) {
					return "", err
				}
				reasons = append(reasons, err.Error())
			}
		}
		return "", &KeyError{Reason: "no extractor produced a key: " + strings.Join(reasons, "; ")}
	}, nil
}

// DefaultMaxKeyBytes is KeyPolicy.MaxBytes when left zero.
const DefaultMaxKeyBytes = 512

// hashedKeyPrefix marks a key that KeyPolicy replaced by its digest.
const hashedKeyPrefix = "sha256:"

// KeyPolicy validates derived keys before they are claimed.
type KeyPolicy struct {
	// MaxBytes is the longest key accepted, in bytes. Postgres btree entries
	// are limited (~2.7 kB) and every byte of the key is stored once per
	// claim, so keep this small. Defaults to 512.
	MaxBytes int
	// HashOverlong replaces keys longer than MaxBytes by "sha256:" and the
	// hex SHA-256 of the key (71 bytes) instead of refusing them. Use it for
	// natural keys that can legitimately be long; the digest is as stable as
	// the key. Defaults to false (over-long keys are invalid).
	HashOverlong bool
}

// Normalize returns the key to claim, or a *KeyError (matching
// ErrInvalidKey) when the key is empty, not valid UTF-8, contains a NUL byte
// (Postgres text cannot store it) or is too long.
func (p KeyPolicy) Normalize(key string) (string, error) {
	maxBytes := p.MaxBytes
	if maxBytes <= 0 {
		maxBytes = DefaultMaxKeyBytes
	}
	switch {
	case key == "":
		return "", &KeyError{Reason: "key is empty"}
	case !utf8.ValidString(key):
		return "", &KeyError{Reason: "key is not valid UTF-8"}
	case strings.IndexByte(key, 0) >= 0:
		return "", &KeyError{Reason: "key contains a NUL byte"}
	case len(key) > maxBytes:
		if !p.HashOverlong {
			return "", &KeyError{Reason: fmt.Sprintf("key is %d bytes, longer than the limit of %d", len(key), maxBytes)}
		}
		sum := sha256.Sum256([]byte(key))
		return hashedKeyPrefix + hex.EncodeToString(sum[:]), nil
	}
	return key, nil
}

func parsePath(path string) ([]string, error) {
	if path == "" {
		return nil, &ConfigError{Field: "key", Reason: "JSON path is empty"}
	}
	segs := strings.Split(path, ".")
	for _, s := range segs {
		if s == "" {
			return nil, &ConfigError{Field: "key", Reason: fmt.Sprintf("JSON path %q has an empty segment", path)}
		}
	}
	return segs, nil
}

func decodePayload(payload []byte) (any, error) {
	if len(bytes.TrimSpace(payload)) == 0 {
		return nil, errors.New("payload is empty")
	}
	// encoding/json silently replaces invalid UTF-8 with U+FFFD, so
	// "a\xffb" and "a\xfeb" would key the same and the second event would
	// be acked as a duplicate of the first. JSON must be UTF-8 (RFC 8259).
	if !utf8.Valid(payload) {
		return nil, errors.New("payload is not valid UTF-8")
	}
	// The same replacement happens to a \u escape of half a UTF-16
	// surrogate pair: "a\ud800b" and "a\udfffb" would key the same.
	if off, ok := loneSurrogate(payload); ok {
		return nil, fmt.Errorf("payload has an unpaired UTF-16 surrogate escape at byte %d", off)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("payload is not valid JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("payload has trailing data after the JSON value")
	}
	return doc, nil
}

// loneSurrogate finds a \uD800-\uDFFF escape inside a JSON string that is
// not a high surrogate followed at once by an escaped low one, and returns
// its offset. It reads escapes only inside strings and does not validate
// anything else (the decoder does).
func loneSurrogate(p []byte) (int, bool) {
	inString := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !inString {
			if c == '"' {
				inString = true
			}
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if i+1 >= len(p) {
				return 0, false // truncated: the decoder reports it
			}
			if p[i+1] != 'u' {
				i++ // skip the escaped character (it may be a quote)
				continue
			}
			r, ok := hex4(p, i+2)
			if !ok {
				return 0, false // malformed: the decoder reports it
			}
			switch {
			case r >= 0xD800 && r <= 0xDBFF: // high: a low escape must follow
				if lo, ok := hex4(p, i+8); ok && i+7 < len(p) && p[i+6] == '\\' && p[i+7] == 'u' && lo >= 0xDC00 && lo <= 0xDFFF {
					i += 11
					continue
				}
				return i, true
			case r >= 0xDC00 && r <= 0xDFFF: // low without a high before it
				return i, true
			}
			i += 5
		}
	}
	return 0, false
}

// hex4 reads four hex digits at p[i:].
func hex4(p []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(p) {
		return 0, false
	}
	var r rune
	for _, c := range p[i : i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		default:
			return 0, false
		}
	}
	return r, true
}

func lookupJSON(doc any, segs []string, src string) (string, error) {
	cur, reason := descendJSON(doc, segs)
	if reason != "" {
		return "", &KeyError{Source: src, Reason: reason}
	}
	switch v := cur.(type) {
	case string:
		if v == "" {
			return "", &KeyError{Source: src, Reason: "field is empty"}
		}
		return v, nil
	case json.Number:
		s, err := canonicalNumber(string(v))
		if err != nil {
			return "", &KeyError{Source: src, Reason: err.Error()}
		}
		return s, nil
	case bool:
		return strconv.FormatBool(v), nil
	default:
		return "", &KeyError{Source: src, Reason: fmt.Sprintf("field is %s, want a string, number or boolean", jsonType(cur))}
	}
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}

// plainInteger reports whether s is a JSON integer in canonical form:
// digits, an optional minus sign, no leading zero, not "-0".
func plainInteger(s string) bool {
	d := strings.TrimPrefix(s, "-")
	if d == "" || (d[0] == '0' && (len(d) > 1 || len(s) > 1)) {
		return false
	}
	for i := 0; i < len(d); i++ {
		if d[i] < '0' || d[i] > '9' {
			return false
		}
	}
	return true
}

// maxExponent bounds the exponent of JSON numbers used as keys: big.Rat
// would otherwise expand 1e999999999 into a gigabyte of digits.
const maxExponent = 400

// canonicalNumber renders a JSON number so that every spelling of the same
// value gives the same key: integers without fraction or exponent (9912),
// other values as the shortest exact decimal (0.5, -12.25).
func canonicalNumber(s string) (string, error) {
	if plainInteger(s) {
		// Already canonical (JSON forbids leading zeros), and the common
		// case: skip big.Rat's allocations.
		return s, nil
	}
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		exp, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
		if err != nil || exp > maxExponent || exp < -maxExponent {
			return "", fmt.Errorf("number %q has an exponent outside ±%d", s, maxExponent)
		}
	}
	var r big.Rat
	if _, ok := r.SetString(s); !ok {
		return "", fmt.Errorf("malformed number %q", s)
	}
	if r.IsInt() {
		return r.Num().String(), nil
	}
	// The JSON text was a finite decimal, so the value is exact in base ten:
	// find the number of fraction digits that represents it exactly.
	for prec := 1; prec <= len(s)+maxExponent; prec++ {
		out := r.FloatString(prec)
		var back big.Rat
		back.SetString(out)
		if back.Cmp(&r) == 0 {
			return out, nil
		}
	}
	return r.FloatString(len(s) + maxExponent), nil
}
