package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/claimtx/claimtx/framework"
)

// FieldError turns a decode error about one value into a ConfigError naming
// the YAML path on its line (yaml.v3 reports only a line); nil for syntax
// errors. The message is the Reason, not the Err, whose Error() repeats
// every problem of the document.
func FieldError(data []byte, err error) *framework.ConfigError {
	var te *yaml.TypeError
	if !errors.As(err, &te) || len(te.Errors) == 0 {
		return nil
	}
	msg := te.Errors[0]
	var line int
	if _, serr := fmt.Sscanf(msg, "line %d:", &line); serr != nil {
		return nil
	}
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil {
		return nil
	}
	paths := map[int]string{} // line -> the first path on it
	record := func(line int, path string) {
		if _, seen := paths[line]; !seen {
			paths[line] = path
		}
	}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := n.Content[i].Value
				if path != "" {
					p = path + "." + p
				}
				record(n.Content[i].Line, p)
				walk(n.Content[i+1], p)
			}
			return
		case yaml.ScalarNode, yaml.AliasNode:
			if path != "" {
				record(n.Line, path)
			}
		}
		for _, c := range n.Content { // a document's or a sequence's
			if n.Kind == yaml.SequenceNode && path != "" {
				record(c.Line, path)
			}
			walk(c, path)
		}
	}
	walk(&root, "")
	field, ok := paths[line]
	if !ok || field == "" {
		return nil // an empty key ("": 1) has no path: a parse error
	}
	reason := strings.TrimSpace(strings.TrimPrefix(msg, fmt.Sprintf("line %d:", line)))
	return &framework.ConfigError{Field: field, Reason: fmt.Sprintf("%s (line %d)", reason, line)}
}

// Decode decodes data over dst strictly, naming a wrong key or value as
// FieldError does.
func Decode(data []byte, dst any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(dst); err != nil && !errors.Is(err, io.EOF) {
		if ce := FieldError(data, err); ce != nil {
			return ce
		}
		return fmt.Errorf("parse YAML: %w", err)
	}
	return nil
}

// ReadFile applies the settings a YAML file sets to c and returns the value
// of the key passthrough as a document of its own for another loader.
// isSection tells the keys that hold settings; a wrong key or value is a
// ConfigError naming its path and line.
func ReadFile[T any](data []byte, byPath map[string]Setting[T], isSection func(path string) bool, passthrough string, c *T) ([]byte, error) {
	var doc, more yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	err := dec.Decode(&doc)
	switch {
	case len(bytes.TrimSpace(data)) == 0 || errors.Is(err, io.EOF):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("parse YAML: %w", err)
	case !errors.Is(dec.Decode(&more), io.EOF):
		return nil, errors.New("parse YAML: more than one document")
	case len(doc.Content) == 0 || doc.Content[0].Kind == yaml.ScalarNode && doc.Content[0].Tag == "!!null":
		return nil, nil
	}
	root := doc.Content[0]
	var section *yaml.Node
	var walk func(n *yaml.Node, prefix string) error
	walk = func(n *yaml.Node, prefix string) error {
		if n.Kind == yaml.AliasNode {
			n = n.Alias
		}
		here := strings.TrimSuffix(prefix, ".")
		if n.Kind != yaml.MappingNode {
			return &framework.ConfigError{Field: cmp.Or(here, "the file"), Reason: fmt.Sprintf("must be a mapping of keys (line %d)", n.Line)}
		}
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			path := prefix + k.Value
			if k.Value == "<<" {
				return &framework.ConfigError{Field: cmp.Or(here, "(root)"), Reason: fmt.Sprintf("merge keys (<<) are not supported (line %d)", k.Line)}
			}
			if seen[k.Value] {
				return &framework.ConfigError{Field: path, Reason: fmt.Sprintf("is set twice (line %d)", k.Line)}
			}
			seen[k.Value] = true
			if v.Kind == yaml.AliasNode {
				v = v.Alias
			}
			switch {
			case path == passthrough:
				section = v
			case isSection(path):
				if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
					continue
				}
				if err := walk(v, path+"."); err != nil {
					return err
				}
			default:
				s, ok := byPath[path]
				if !ok {
					return &framework.ConfigError{Field: path, Reason: fmt.Sprintf("unknown key (line %d)", k.Line)}
				}
				if v.Kind != yaml.ScalarNode {
					return &framework.ConfigError{Field: path, Reason: fmt.Sprintf("must be a single value (line %d)", v.Line)}
				}
				if v.Tag == "!!null" {
					continue // "key:" with nothing after it: the default
				}
				if err := s.Set(c, v.Value); err != nil {
					return parseError(path, s.Secret, err, fmt.Sprintf(" (line %d)", v.Line))
				}
			}
		}
		return nil
	}
	if err := walk(root, ""); err != nil || section == nil {
		return nil, err
	}
	// Through a plain value, so that aliases to anchors outside the
	// section are resolved before it stands alone.
	var v any
	out, err := []byte(nil), section.Decode(&v)
	if err == nil {
		out, err = yaml.Marshal(v)
	}
	if err != nil {
		return nil, fmt.Errorf("parse YAML: %w", err)
	}
	return out, nil
}
