package framework

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/internal/pg"
)

// KeyFunc derives the deduplication key of a message. It must be a pure
// function of what the producer fixed (a metadata field, payload fields), so
// that every redelivery, republish and dead-letter replay of the same logical
// event yields the same key. Never derive it from broker delivery ids,
// offsets or the Watermill UUID: those change on republish.
//
// Key specs (ParseKeySpec, Registry.ParseKey) build the usual ones; write a
// KeyFunc, and register it on a Registry, only for what specs cannot say.
// A KeyFunc that cannot key a message returns a *KeyError; such messages
// are poisoned, not retried.
type KeyFunc func(*message.Message) (string, error)

// fromMetadata keys messages by one metadata field (for AMQP, a header; for
// Kafka, a record header): spec "metadata:NAME".
func fromMetadata(field string) (KeyFunc, error) {
	if field == "" {
		return nil, &ConfigError{Field: "key", Reason: "metadata field name is empty"}
	}
	src := fmt.Sprintf("metadata %q", field)
	return func(msg *message.Message) (string, error) { return metadataKey(msg, field, src) }, nil
}

// metadataKey is metadata field as a key part (src names it in errors).
func metadataKey(msg *message.Message, field, src string) (string, error) {
	v, ok := msg.Metadata[field]
	if !ok {
		return "", &KeyError{Source: src, Reason: "field is missing"}
	}
	if v == "" {
		return "", &KeyError{Source: src, Reason: "field is empty"}
	}
	return v, nil
}

// fromJSON keys messages by a field of their JSON payload, addressed by a
// dotted path ("order_id", "order.id", "items.0.sku"): spec "json:PATH".
// Strings are used as they are; numbers are rendered canonically so that
// 9912, 9912.0 and 9.912e+03 all give "9912"; booleans give
// "true"/"false". Objects, arrays and null are refused.
//
// The cost is linear in the payload, and bounded: a payload over 4 MiB or
// nested deeper than 64 levels, or a number longer than 512 bytes (it could
// never be a valid key), is refused with a *KeyError before the work it
// would cost, so the message is poisoned with the reason instead of holding
// the consumer.
func fromJSON(path string) (KeyFunc, error) {
	segs, err := parsePath(path)
	if err != nil {
		return nil, err
	}
	src := fmt.Sprintf("payload %q", path)
	fp := newFieldPaths(segs)
	return func(msg *message.Message) (string, error) {
		var out [1]fieldValue
		payloadValues(msg.Payload, fp, out[:])
		return keyValue(out[0], src)
	}, nil
}

// firstNonEmpty tries each KeyFunc in order and returns the first key that
// is produced without error: spec "first:SPEC|SPEC...", e.g. an event_id
// header when the producer sets one, else the order_id from the payload.
// When all fail, the error is a *KeyError listing every reason.
//
// Each source keys in its own namespace, for event_id "3" on one message and
// order_id 3 on another are different events: a key from the first KeyFunc
// is returned as it is, unless it starts with '\'; a key k from the KeyFunc
// at index i ≥ 1, or a first key that starts with '\', is returned as
// `\i:k` (e.g. `\1:3`). Unmarked keys never start with '\' and marked ones
// name their source, so no two sources can give the same key, while keys of
// the first (preferred) source stay as they were before namespacing.
// Registry.parseFirst hands it at least one KeyFunc, none nil.
func firstNonEmpty(fs ...KeyFunc) KeyFunc {
	return func(msg *message.Message) (string, error) {
		reasons := make([]string, 0, len(fs))
		for i, f := range fs {
			k, err := f(msg)
			if err == nil && k != "" {
				return sourceKey(i, k), nil
			}
			if err != nil {
				// A non-key error (a bug in a user extractor, say) must not be
				// masked as "no key": report it as is.
				var ke *KeyError
				if !errors.As(err, &ke) {
					return "", err
				}
				reasons = append(reasons, err.Error())
			}
		}
		return "", &KeyError{Reason: "no extractor produced a key: " + strings.Join(reasons, "; ")}
	}
}

// sourceMark starts the key firstNonEmpty took from any source but the
// first, followed by the source's index and ':'.
const sourceMark = '\\'

// sourceKey namespaces key k from firstNonEmpty source i (see firstNonEmpty).
func sourceKey(i int, k string) string {
	if i == 0 && k[0] != sourceMark {
		return k
	}
	return string(sourceMark) + strconv.Itoa(i) + ":" + k
}

// maxKeyBytes is KeyPolicy.MaxBytes when left zero.
const maxKeyBytes = pg.DefaultMaxKeyBytes

// hashedKeyPrefix marks a key that KeyPolicy replaced by its digest.
const hashedKeyPrefix = "sha256:"

// KeyPolicy validates derived keys before they are claimed.
type KeyPolicy struct {
	// MaxBytes is the longest key accepted, in bytes. Postgres btree entries
	// are limited (~2.7 kB) and every byte of the key is stored once per
	// claim, so keep this small. Defaults to 512 (when zero).
	MaxBytes int
	// HashOverlong replaces keys longer than MaxBytes by "sha256:" and the
	// hex SHA-256 of the key (71 bytes) instead of refusing them. Use it for
	// natural keys that can legitimately be long; the digest is as stable as
	// the key. Defaults to false (over-long keys are invalid).
	HashOverlong bool
}

// Normalize returns the key to claim, or a *KeyError when the key is
// empty, not valid UTF-8, contains a NUL byte (Postgres text cannot store
// it) or is too long.
func (p KeyPolicy) Normalize(key string) (string, error) {
	maxBytes := p.MaxBytes
	if maxBytes <= 0 {
		maxBytes = maxKeyBytes
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

// Limits of JSON key lookups. The whole payload is read to find a field
// (and checked, so that a malformed payload is refused rather than keyed),
// which costs time and memory linear in its size; these bound both so that
// one hostile message cannot hold a consumer, or in batch mode every
// message behind it. A payload over a limit cannot be keyed and is poisoned
// with the reason.
const (
	// maxPayloadBytes is 4 MiB: four times Kafka's default maximum record
	// and forty times an ordinary large RabbitMQ message. Larger payloads
	// should be keyed by metadata, which costs nothing per payload byte.
	maxPayloadBytes = 4 << 20
	// maxPayloadDepth is the deepest nesting of arrays and objects accepted.
	// Events are rarely nested ten deep; encoding/json alone would accept
	// 10,000 levels, each a recursive call and an allocation.
	maxPayloadDepth = 64
)

func decodePayload(payload []byte) (any, error) {
	// First, from the length alone: nothing below runs on a payload that
	// is too large.
	if len(payload) > maxPayloadBytes {
		return nil, fmt.Errorf("payload is %d bytes, larger than the limit of %d for JSON key lookups", len(payload), maxPayloadBytes)
	}
	if len(bytes.TrimSpace(payload)) == 0 {
		return nil, errors.New("payload is empty")
	}
	// encoding/json silently replaces invalid UTF-8 with U+FFFD, so
	// "a\xffb" and "a\xfeb" would key the same and the second event would
	// be acked as a duplicate of the first. JSON must be UTF-8 (RFC 8259).
	if !utf8.Valid(payload) {
		return nil, errors.New("payload is not valid UTF-8")
	}
	if err := scanPayload(payload); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("payload is not valid JSON: %w", err)
	}
	// Not dec.More(): it reports no further value before a ']' or '}', so
	// `{"order_id": 1}]` would pass. JSON whitespace only may follow.
	if rest := bytes.TrimLeft(payload[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return nil, errors.New("payload has trailing data after the JSON value")
	}
	return doc, nil
}

// scanPayload makes one pass over the payload, before the decoder, and
// refuses what the decoder would accept but must not be keyed:
//   - nesting deeper than maxPayloadDepth;
//   - a \uD800-\uDFFF escape inside a string that is not a high surrogate
//     followed at once by an escaped low one: encoding/json decodes it to
//     U+FFFD, so "a\ud800b" and "a\udfffb" would share a key.
//
// It validates nothing else (the decoder does), so on malformed input it
// may stop early or count brackets oddly; either way the payload is refused.
func scanPayload(p []byte) error {
	inString := false
	depth := 0
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !inString {
			switch c {
			case '"':
				inString = true
			case '[', '{':
				depth++
				if depth > maxPayloadDepth {
					return fmt.Errorf("payload nests deeper than %d levels (at byte %d)", maxPayloadDepth, i)
				}
			case ']', '}':
				depth--
			}
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			n, lone := escapeLen(p, i)
			switch {
			case lone:
				return unpairedSurrogate(i)
			case n > 0:
				i += n - 1
			case i+1 < len(p) && p[i+1] != 'u':
				i++ // skip the escaped character (it may be a quote)
			default:
				return nil // truncated or malformed: the decoder reports it
			}
		}
	}
	return nil
}

// escapeLen is the length of the escape at p[i] (a backslash), or 0 when it
// is malformed; lone reports a \uD800-\uDFFF escape that is not a high
// surrogate followed at once by an escaped low one.
func escapeLen(p []byte, i int) (n int, lone bool) {
	if i+1 >= len(p) {
		return 0, false
	}
	switch p[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, false
	case 'u':
		r, ok := hex4(p, i+2)
		switch {
		case !ok:
			return 0, false
		case r >= 0xD800 && r <= 0xDBFF: // high: a low escape must follow
			if lo, ok := hex4(p, i+8); ok && p[i+6] == '\\' && p[i+7] == 'u' && lo >= 0xDC00 && lo <= 0xDFFF {
				return 12, false
			}
			return 0, true
		case r >= 0xDC00 && r <= 0xDFFF: // low without a high before it
			return 0, true
		}
		return 6, false
	}
	return 0, false
}

func unpairedSurrogate(off int) error {
	return fmt.Errorf("payload has an unpaired UTF-16 surrogate escape at byte %d", off)
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

// descendJSON follows segs into doc and returns the value found, or a
// reason why there is none: payloadValues's path through the decoder.
func descendJSON(doc any, segs []string) (any, string) {
	cur := doc
	for _, s := range segs {
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[s]
			if !ok {
				return nil, "field is missing"
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(s)
			if err != nil || i < 0 || i >= len(v) {
				return nil, fmt.Sprintf("no element %q in array of %d", s, len(v))
			}
			cur = v[i]
		default:
			return nil, fmt.Sprintf("cannot descend into %s at %q", jsonType(cur), s)
		}
	}
	return cur, ""
}

// keyValue renders what a payload path led to as a key part.
func keyValue(f fieldValue, src string) (string, error) {
	if f.reason != "" {
		return "", &KeyError{Source: src, Reason: f.reason}
	}
	switch v := f.v.(type) {
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
		return "", &KeyError{Source: src, Reason: fmt.Sprintf("field is %s, want a string, number or boolean", jsonType(f.v))}
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
	return d != "" && allDigits(d) && (d[0] != '0' || s == "0")
}

// maxExponent bounds the exponent of JSON numbers used as keys: 1e999999999
// would otherwise expand into a gigabyte of digits.
const maxExponent = 400

// maxNumberBytes bounds the text of a JSON number used in a key. A longer
// number cannot make a valid key under the default KeyPolicy (its canonical
// form keeps every significant digit), so it is refused from its length
// alone, before any work on its digits. It is fixed rather than taken from
// the consumer's KeyPolicy because a KeyFunc does not see the policy; a
// numeric identifier of more than 512 digits is not an identifier.
const maxNumberBytes = maxKeyBytes

// canonicalNumber renders a JSON number so that every spelling of the same
// value gives the same key: integers without fraction or exponent (9912),
// other values as the shortest exact decimal (0.5, -12.25). It works on the
// decimal digits as text, in time linear in len(s) plus the exponent (both
// bounded), instead of through big.Rat, whose search for the shortest exact
// rendering cost time super-linear in the digits.
func canonicalNumber(s string) (string, error) {
	if len(s) > maxNumberBytes {
		return "", fmt.Errorf("number is %d bytes, longer than the limit of %d", len(s), maxNumberBytes)
	}
	if plainInteger(s) {
		// Already canonical (JSON forbids leading zeros), and the common
		// case: no allocation.
		return s, nil
	}
	rest := s
	neg := strings.HasPrefix(rest, "-")
	if neg {
		rest = rest[1:]
	}
	mant, expText, hasExp := strings.Cut(rest, "e")
	if !hasExp {
		mant, expText, hasExp = strings.Cut(rest, "E")
	}
	exp := 0
	if hasExp {
		var err error
		exp, err = strconv.Atoi(strings.TrimPrefix(expText, "+"))
		if err != nil || exp > maxExponent || exp < -maxExponent {
			return "", fmt.Errorf("number %q has an exponent outside ±%d", s, maxExponent)
		}
	}
	intPart, frac, hasPoint := strings.Cut(mant, ".")
	if intPart == "" || (hasPoint && frac == "") || !allDigits(intPart) || !allDigits(frac) {
		return "", fmt.Errorf("malformed number %q", s)
	}
	// value = digits × 10^exp, digits without leading or trailing zeros.
	digits := strings.TrimLeft(intPart+frac, "0")
	exp -= len(frac)
	trimmed := strings.TrimRight(digits, "0")
	exp += len(digits) - len(trimmed)
	digits = trimmed
	if digits == "" {
		return "0", nil // -0, 0.0, 0e5: one value, one key
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	switch point := len(digits) + exp; {
	case exp >= 0: // an integer
		b.Grow(len(digits) + exp)
		b.WriteString(digits)
		b.WriteString(strings.Repeat("0", exp))
	case point > 0:
		b.WriteString(digits[:point])
		b.WriteByte('.')
		b.WriteString(digits[point:])
	default:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", -point))
		b.WriteString(digits)
	}
	return b.String(), nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
