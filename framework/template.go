package framework

import (
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Template builds a KeyFunc from text with placeholders, so that one spec can
// namespace and combine fields:
//
//	order-completed:{payload.order_id}
//	{metadata.tenant}:{metadata.event_id}
//
// {payload.PATH} reads a JSON payload field by dotted path (rendered as
// FromJSON does), {metadata.NAME} a metadata field. "{{" and "}}" stand for
// literal braces. Every placeholder must resolve to a non-empty value, or the
// message cannot be keyed. A template without placeholders is refused: it
// would give every message the same key.
func Template(tmpl string) (KeyFunc, error) {
	parts, err := parseTemplate(tmpl)
	if err != nil {
		return nil, err
	}
	needPayload := false
	for _, p := range parts {
		if p.kind == partPayload {
			needPayload = true
		}
	}
	return func(msg *message.Message) (string, error) {
		var doc any
		var docErr error
		if needPayload {
			// Decoded once per message however many payload fields the
			// template names.
			doc, docErr = decodePayload(msg.Payload)
		}
		var b strings.Builder
		for _, p := range parts {
			switch p.kind {
			case partLiteral:
				b.WriteString(p.text)
			case partMetadata:
				src := fmt.Sprintf("metadata %q", p.text)
				v, ok := msg.Metadata[p.text]
				if !ok {
					return "", &KeyError{Source: src, Reason: "field is missing"}
				}
				if v == "" {
					return "", &KeyError{Source: src, Reason: "field is empty"}
				}
				b.WriteString(v)
			case partPayload:
				src := fmt.Sprintf("payload %q", p.text)
				if docErr != nil {
					return "", &KeyError{Source: src, Reason: docErr.Error()}
				}
				v, err := lookupJSON(doc, p.path, src)
				if err != nil {
					return "", err
				}
				b.WriteString(v)
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
