package framework

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/internal/pg"
)

// KeyFunc derives the deduplication key of a message. It must be a pure
// function of what the producer fixed (metadata, payload fields), so that
// every redelivery, republish and dead-letter replay of one event yields the
// same key: never broker delivery ids, offsets or the Watermill UUID.
//
// Key specs (ParseKeySpec, Registry.ParseKey) build the usual ones. A
// KeyFunc that cannot key a message returns a *KeyError; such messages are
// poisoned, not retried.
type KeyFunc func(*message.Message) (string, error)

// fromMetadata is spec "metadata:NAME" (an AMQP header, a Kafka record header).
func fromMetadata(field string) (KeyFunc, error) {
	if field == "" {
		return nil, &ConfigError{Field: "key", Reason: "metadata field name is empty"}
	}
	src := fmt.Sprintf("metadata %q", field)
	return func(msg *message.Message) (string, error) { return metadataKey(msg, field, src) }, nil
}

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

// fromJSON is spec "json:PATH", a dotted path into the JSON payload
// ("order.id", "items.0.sku"), rendered by keyValue.
func fromJSON(path string) (KeyFunc, error) { return payloadFunc(path, keyValue) }

// payloadFunc reads the value at path in the payload and converts it; the
// time spec json: shares it.
func payloadFunc[R any](path string, conv func(fieldValue, string) (R, error)) (func(*message.Message) (R, error), error) {
	segs, err := parsePath(path)
	if err != nil {
		return nil, err
	}
	src := fmt.Sprintf("payload %q", path)
	fp := newFieldPaths(segs)
	return func(msg *message.Message) (R, error) {
		var out [1]fieldValue
		payloadValues(msg.Payload, fp, out[:])
		return conv(out[0], src)
	}, nil
}

// firstNonEmpty is spec "first:SPEC|SPEC...": the first key produced
// without error, else a *KeyError listing every reason. Each source keys in
// its own namespace: a key k from source i ≥ 1, or a first-source key that
// starts with '\', becomes `\i:k` (docs/design.md, "Keys are injective").
func firstNonEmpty(fs ...KeyFunc) KeyFunc {
	return func(msg *message.Message) (string, error) {
		reasons := make([]string, 0, len(fs))
		for i, f := range fs {
			k, err := f(msg)
			if err == nil && k != "" {
				return sourceKey(i, k), nil
			}
			if err != nil {
				// A non-key error (a bug in a user extractor) must not be
				// masked as "no key".
				if !errors.As(err, new(*KeyError)) {
					return "", err
				}
				reasons = append(reasons, err.Error())
			}
		}
		return "", &KeyError{Reason: "no extractor produced a key: " + strings.Join(reasons, "; ")}
	}
}

const sourceMark = '\\'

func sourceKey(i int, k string) string {
	if i == 0 && k[0] != sourceMark {
		return k
	}
	return string(sourceMark) + strconv.Itoa(i) + ":" + k
}

const maxKeyBytes = pg.DefaultMaxKeyBytes

// KeyPolicy validates derived keys before they are claimed.
type KeyPolicy struct {
	// MaxBytes is the longest key accepted, in bytes (default 512). Postgres
	// btree entries are limited (~2.7 kB) and every claim stores the key.
	MaxBytes int
	// HashOverlong replaces keys longer than MaxBytes by "sha256:" and their
	// hex SHA-256 (71 bytes, as stable as the key) instead of refusing them,
	// for natural keys that can legitimately be long.
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
		return "sha256:" + hex.EncodeToString(sum[:]), nil
	}
	return key, nil
}

func parsePath(path string) ([]string, error) {
	if path == "" {
		return nil, &ConfigError{Field: "key", Reason: "JSON path is empty"}
	}
	segs := strings.Split(path, ".")
	if slices.Contains(segs, "") {
		return nil, &ConfigError{Field: "key", Reason: fmt.Sprintf("JSON path %q has an empty segment", path)}
	}
	return segs, nil
}

// Limits of JSON lookups, so that one hostile message cannot hold a
// consumer; why these values: docs/design.md, "Keys cost time linear in the
// payload".
const (
	maxPayloadBytes = 4 << 20
	maxPayloadDepth = 64
)

// decodePayload is the whole document as encoding/json reads it, or the
// reason the payload is refused.
func decodePayload(payload []byte) (any, error) {
	if len(payload) > maxPayloadBytes {
		return nil, fmt.Errorf("payload is %d bytes, larger than the limit of %d for JSON key lookups", len(payload), maxPayloadBytes)
	}
	if len(bytes.TrimSpace(payload)) == 0 {
		return nil, errors.New("payload is empty")
	}
	// encoding/json replaces invalid UTF-8 with U+FFFD, so "a\xffb" and
	// "a\xfeb" would key the same and the second event be acked as a
	// duplicate of the first.
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
	// `{"order_id": 1}]` would pass.
	if rest := bytes.TrimLeft(payload[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return nil, errors.New("payload has trailing data after the JSON value")
	}
	return doc, nil
}

// scanPayload refuses, before the decoder, what it would accept but must
// not be keyed: nesting deeper than maxPayloadDepth, and a surrogate escape
// that is not a high one followed at once by an escaped low one (the
// decoder makes it U+FFFD, so "a\ud800b" and "a\udfffb" would share a key).
// It validates nothing else: on malformed input it may stop early, and the
// decoder refuses the payload.
func scanPayload(p []byte) error {
	inString, depth := false, 0
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '"':
			inString = !inString
		case inString && c == '\\':
			n, lone := escapeLen(p, i)
			switch {
			case lone:
				return fmt.Errorf("payload has an unpaired UTF-16 surrogate escape at byte %d", i)
			case n > 0:
				i += n - 1
			case i+1 < len(p) && p[i+1] != 'u':
				i++ // the escaped character may be a quote
			default:
				return nil
			}
		case inString:
		case c == '[' || c == '{':
			if depth++; depth > maxPayloadDepth {
				return fmt.Errorf("payload nests deeper than %d levels (at byte %d)", maxPayloadDepth, i)
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return nil
}

// escapeLen is the length of the escape at p[i] (a backslash), or 0 when it
// is malformed; lone reports a lone surrogate escape (see scanPayload).
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
		case !utf16.IsSurrogate(r):
			return 6, false
		}
		if lo, ok := hex4(p, i+8); ok && p[i+6] == '\\' && p[i+7] == 'u' && utf16.DecodeRune(r, lo) != utf8.RuneError {
			return 12, false
		}
		return 0, true
	}
	return 0, false
}

// hex4 reads four hex digits at p[i:].
func hex4(p []byte, i int) (rune, bool) {
	if i+4 > len(p) {
		return 0, false
	}
	var b [2]byte
	if _, err := hex.Decode(b[:], p[i:i+4]); err != nil {
		return 0, false
	}
	return rune(b[0])<<8 | rune(b[1]), true
}

// descendJSON follows segs into doc: the value found, or why there is none.
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

// keyValue renders what a payload path led to as a key part: strings as
// they are, numbers canonically (9912, 9912.0 and 9.912e+03 give "9912"),
// booleans as "true"/"false"; objects, arrays and null are refused.
func keyValue(f fieldValue, src string) (string, error) {
	switch v := f.v.(type) {
	case string:
		if v != "" {
			return v, nil
		}
		f.reason = "field is empty"
	case json.Number:
		s, err := canonicalNumber(string(v))
		if err == nil {
			return s, nil
		}
		f.reason = err.Error()
	case bool:
		return strconv.FormatBool(v), nil
	default: // nil too when f.reason tells why there is no value
		if f.reason == "" {
			f.reason = fmt.Sprintf("field is %s, want a string, number or boolean", jsonType(v))
		}
	}
	return "", &KeyError{Source: src, Reason: f.reason}
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

// plainInteger reports whether s is a JSON integer in canonical form: no
// leading zero, not "-0".
func plainInteger(s string) bool {
	d := strings.TrimPrefix(s, "-")
	return d != "" && allDigits(d) && (d[0] != '0' || s == "0")
}

const maxExponent = 400 // 1e999999999 would expand into a gigabyte of digits

// canonicalNumber renders a JSON number so that every spelling of one value
// gives one key: integers without fraction or exponent (9912), other values
// as the shortest exact decimal (0.5), on the digits as text (linear, unlike
// big.Rat). A number longer than the default key limit could never be a
// valid key (a KeyFunc does not see the consumer's policy).
func canonicalNumber(s string) (string, error) {
	if len(s) > maxKeyBytes {
		return "", fmt.Errorf("number is %d bytes, longer than the limit of %d", len(s), maxKeyBytes)
	}
	if plainInteger(s) {
		return s, nil // the common case, already canonical: no allocation
	}
	rest, neg := strings.CutPrefix(s, "-")
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
	switch point := len(digits) + exp; {
	case exp >= 0:
		digits += strings.Repeat("0", exp)
	case point > 0:
		digits = digits[:point] + "." + digits[point:]
	default:
		digits = "0." + strings.Repeat("0", -point) + digits
	}
	if neg {
		return "-" + digits, nil
	}
	return digits, nil
}

func allDigits(s string) bool { return strings.TrimLeft(s, "0123456789") == "" }
