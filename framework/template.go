package framework

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
)

// fromTemplate builds a KeyFunc from text with placeholders (spec
// "template:TEXT"), so that one spec can namespace and combine fields:
//
//	order-completed:{payload.order_id}
//	{metadata.tenant}:{metadata.event_id}
//
// {payload.PATH} reads a JSON payload field by dotted path (rendered as
// json: does), {metadata.NAME} a metadata field. "{{" and "}}" stand for
// literal braces. Every placeholder must resolve to a non-empty value, or the
// message cannot be keyed. A template without placeholders is refused: it
// would give every message the same key.
//
// Keys are injective: two different tuples of values never give the same
// key, for a collision would ack the second event as a duplicate. So:
//   - placeholders with nothing between them ({payload.a}{payload.b}) are
//     refused: (1, 23) and (12, 3) would both give "123";
//   - in the value of every placeholder that another placeholder follows, the
//     first character of the literal text after it, and the escape
//     character '\', are preceded by '\': with {metadata.tenant}:{metadata.event_id}
//     the tenant "a:b" and event "c" give `a\:b:c`, while "a" and "b:c"
//     give "a:b:c". The literal text between two placeholders must
//     therefore not start with '\' (refused).
//
// Values containing neither character, and the last placeholder's value
// whatever it contains, are written as they are, so such keys are the same
// as before escaping was introduced.
func fromTemplate(tmpl string) (KeyFunc, error) {
	parts, err := parseTemplate(tmpl)
	if err != nil {
		return nil, err
	}
	var paths [][]string
	srcs := make([]string, len(parts)) // for errors, rendered once
	for i, p := range parts {
		switch p.kind {
		case partMetadata:
			srcs[i] = fmt.Sprintf("metadata %q", p.text)
		case partPayload:
			srcs[i] = fmt.Sprintf("payload %q", p.text)
			paths = append(paths, p.path)
		}
	}
	fp := newFieldPaths(paths...)
	return func(msg *message.Message) (string, error) {
		var buf [4]fieldValue
		var vals []fieldValue
		if len(paths) > 0 {
			// Read once per message however many payload fields the
			// template names.
			if len(paths) > len(buf) {
				vals = make([]fieldValue, len(paths))
			} else {
				vals = buf[:len(paths)]
			}
			payloadValues(msg.Payload, fp, vals)
		}
		var b strings.Builder
		j := 0
		for i, p := range parts {
			switch p.kind {
			case partLiteral:
				b.WriteString(p.text)
			case partMetadata:
				v, err := metadataKey(msg, p.text, srcs[i])
				if err != nil {
					return "", err
				}
				writeEscaped(&b, v, p.escape)
			case partPayload:
				v, err := keyValue(vals[j], srcs[i])
				j++
				if err != nil {
					return "", err
				}
				writeEscaped(&b, v, p.escape)
			}
		}
		return b.String(), nil
	}, nil
}

type partKind int

const (
	partLiteral partKind = iota
	partMetadata
	partPayload
)

type templatePart struct {
	kind partKind
	text string   // literal text, metadata name or payload path
	path []string // payload path segments
	// escape is, for a placeholder that another placeholder follows, the
	// first character (as bytes) of the literal after it: the character
	// that ends the value when a key is read left to right. Empty for the
	// last placeholder, which the end of the key (or a fixed suffix)
	// delimits.
	escape string
}

// templateEscape precedes, in a value, the separator's first character and
// itself.
const templateEscape = '\\'

// writeEscaped writes v, with templateEscape before every occurrence of sep
// and of templateEscape when sep is not empty. Reading the key left to
// right, an unescaped sep then always ends the value, so the values can be
// recovered from the key: distinct tuples give distinct keys. Linear in
// len(v); the common value without either character is copied as is.
func writeEscaped(b *strings.Builder, v, sep string) {
	if sep == "" || (!strings.Contains(v, sep) && strings.IndexByte(v, templateEscape) < 0) {
		b.WriteString(v)
		return
	}
	for i := 0; i < len(v); {
		switch {
		case strings.HasPrefix(v[i:], sep):
			b.WriteByte(templateEscape)
			b.WriteString(sep)
			i += len(sep)
		case v[i] == templateEscape:
			b.WriteString(`\\`)
			i++
		default:
			b.WriteByte(v[i])
			i++
		}
	}
}

// firstChar is the first UTF-8 character of s as bytes, or its first byte
// when s does not start with valid UTF-8.
func firstChar(s string) string {
	_, n := utf8.DecodeRuneInString(s)
	return s[:n]
}

// placeholderText renders a placeholder part back as the user wrote it,
// for error messages.
func (p templatePart) placeholderText() string {
	if p.kind == partMetadata {
		return "{metadata." + p.text + "}"
	}
	return "{payload." + p.text + "}"
}

func parseTemplate(tmpl string) ([]templatePart, error) {
	bad := func(reason string) error {
		return &ConfigError{Field: "key", Reason: fmt.Sprintf("template %q: %s", tmpl, reason)}
	}
	var parts []templatePart
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			parts = append(parts, templatePart{kind: partLiteral, text: lit.String()})
			lit.Reset()
		}
	}
	placeholders := 0
	for i := 0; i < len(tmpl); i++ {
		c := tmpl[i]
		switch {
		case c == '{' && i+1 < len(tmpl) && tmpl[i+1] == '{':
			lit.WriteByte('{')
			i++
		case c == '}' && i+1 < len(tmpl) && tmpl[i+1] == '}':
			lit.WriteByte('}')
			i++
		case c == '}':
			return nil, bad(fmt.Sprintf("unmatched '}' at byte %d (write '}}' for a literal brace)", i))
		case c == '{':
			end := strings.IndexByte(tmpl[i+1:], '}')
			if end < 0 {
				return nil, bad(fmt.Sprintf("unclosed '{' at byte %d", i))
			}
			ref := tmpl[i+1 : i+1+end]
			if strings.ContainsRune(ref, '{') {
				return nil, bad(fmt.Sprintf("nested '{' at byte %d", i))
			}
			flush()
			p, err := parsePlaceholder(ref)
			if err != nil {
				return nil, bad(err.Error())
			}
			parts = append(parts, p)
			placeholders++
			i += end + 1
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	if placeholders == 0 {
		return nil, bad("no placeholder: every message would get the same key")
	}
	// Injectivity: every placeholder followed by another needs a separator,
	// whose first character its values escape (see fromTemplate).
	last := -1
	for i, p := range parts {
		if p.kind != partLiteral {
			last = i
		}
	}
	for i := 0; i < last; i++ {
		p := parts[i]
		if p.kind == partLiteral {
			continue
		}
		next := parts[i+1]
		if next.kind != partLiteral {
			return nil, bad(fmt.Sprintf("placeholders %s and %s are adjacent: values (1, 23) and (12, 3) would give one key; put a separator between them",
				p.placeholderText(), next.placeholderText()))
		}
		if next.text[0] == templateEscape {
			return nil, bad(fmt.Sprintf("the text after %s starts with '\\', which values use to escape the separator; start it with another character",
				p.placeholderText()))
		}
		parts[i].escape = firstChar(next.text)
	}
	return parts, nil
}

func parsePlaceholder(ref string) (templatePart, error) {
	source, name, ok := strings.Cut(ref, ".")
	if !ok || name == "" {
		return templatePart{}, fmt.Errorf("placeholder {%s} must be {payload.PATH} or {metadata.NAME}", ref)
	}
	switch source {
	case "metadata":
		return templatePart{kind: partMetadata, text: name}, nil
	case "payload":
		segs, err := parsePath(name)
		if err != nil {
			return templatePart{}, fmt.Errorf("placeholder {%s}: empty path segment", ref)
		}
		return templatePart{kind: partPayload, text: name, path: segs}, nil
	default:
		return templatePart{}, fmt.Errorf("placeholder {%s}: unknown source %q (want payload or metadata)", ref, source)
	}
}
