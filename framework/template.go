package framework

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
)

// fromTemplate is spec "template:TEXT": literal text with {payload.PATH}
// (rendered as json: does) and {metadata.NAME} placeholders, "{{" and "}}"
// for literal braces. Every placeholder must resolve to a non-empty value; a
// template without one is refused, as every message would get the same key.
//
// Keys are injective (docs/design.md, "Keys are injective"): adjacent
// placeholders are refused, and in the value of each placeholder another
// follows, '\' and the first character of the literal after it are escaped
// with '\'. The last placeholder's value is written as it is.
func fromTemplate(tmpl string) (KeyFunc, error) {
	parts, err := parseTemplate(tmpl)
	if err != nil {
		return nil, err
	}
	var paths [][]string
	for _, p := range parts {
		if p.kind == partPayload {
			paths = append(paths, p.path)
		}
	}
	fp := newFieldPaths(paths...)
	return func(msg *message.Message) (string, error) {
		var buf [4]fieldValue
		vals := slices.Grow(buf[:0], len(paths))[:len(paths)]
		if len(paths) > 0 {
			payloadValues(msg.Payload, fp, vals) // one pass for every field
		}
		var b strings.Builder
		j := 0
		for _, p := range parts {
			v, err := p.text, error(nil)
			switch p.kind {
			case partMetadata:
				v, err = metadataKey(msg, p.text, p.src)
			case partPayload:
				v, err = keyValue(vals[j], p.src)
				j++
			}
			if err != nil {
				return "", err
			}
			if p.escape != nil {
				v = p.escape.Replace(v) // not WriteString(&b): b would escape
			}
			b.WriteString(v)
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
	ref  string   // the placeholder as the user wrote it
	src  string   // KeyError.Source
	// escape is, for a placeholder another follows, the escaper of the
	// first character of the literal after it; nil for the last placeholder.
	escape *strings.Replacer
}

const templateEscape = '\\'

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
	last := -1
	for i := 0; i < len(tmpl); i++ {
		c := tmpl[i]
		switch {
		case (c == '{' || c == '}') && i+1 < len(tmpl) && tmpl[i+1] == c:
			lit.WriteByte(c)
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
			last = len(parts)
			parts = append(parts, p)
			i += end + 1
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	if last < 0 {
		return nil, bad("no placeholder: every message would get the same key")
	}
	// Every placeholder followed by another needs a separator (see fromTemplate).
	for i := 0; i < last; i++ {
		p, next := parts[i], parts[i+1]
		switch {
		case p.kind == partLiteral:
		case next.kind != partLiteral:
			return nil, bad(fmt.Sprintf("placeholders %s and %s are adjacent: values (1, 23) and (12, 3) would give one key; put a separator between them", p.ref, next.ref))
		case next.text[0] == templateEscape:
			return nil, bad(fmt.Sprintf("the text after %s starts with '\\', which values use to escape the separator; start it with another character", p.ref))
		default:
			_, n := utf8.DecodeRuneInString(next.text)
			parts[i].escape = strings.NewReplacer(`\`, `\\`, next.text[:n], `\`+next.text[:n])
		}
	}
	return parts, nil
}

func parsePlaceholder(ref string) (templatePart, error) {
	source, name, ok := strings.Cut(ref, ".")
	if !ok || name == "" {
		return templatePart{}, fmt.Errorf("placeholder {%s} must be {payload.PATH} or {metadata.NAME}", ref)
	}
	p := templatePart{text: name, ref: "{" + ref + "}", src: fmt.Sprintf("%s %q", source, name)}
	switch source {
	case "metadata":
		p.kind = partMetadata
	case "payload":
		segs, err := parsePath(name)
		if err != nil {
			return templatePart{}, fmt.Errorf("placeholder {%s}: empty path segment", ref)
		}
		p.kind, p.path = partPayload, segs
	default:
		return templatePart{}, fmt.Errorf("placeholder {%s}: unknown source %q (want payload or metadata)", ref, source)
	}
	return p, nil
}
