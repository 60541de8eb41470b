package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/claimtx/claimtx/framework"
)

// FieldError turns a decode error about one value ("line 3: cannot
// unmarshal !!str `soon` into time.Duration", or an unknown key) into a
// *framework.ConfigError whose Field is that value's YAML path, so a file's
// mistake is named like a Validate one. yaml.v3 reports only a line, so the
// path is the key found on that line. It returns nil for syntax errors,
// which have no field to name. The decoder's message is the Reason, not
// the Err: its Error() repeats every problem of the document.
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
	paths := map[int]string{}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := n.Content[i].Value
				if path != "" {
					p = path + "." + p
				}
				if _, seen := paths[n.Content[i].Line]; !seen {
					paths[n.Content[i].Line] = p
				}
				walk(n.Content[i+1], p)
			}
		case yaml.SequenceNode:
			for _, c := range n.Content {
				if _, seen := paths[c.Line]; !seen && path != "" {
					paths[c.Line] = path
				}
				walk(c, path)
			}
		case yaml.ScalarNode, yaml.AliasNode:
			if _, seen := paths[n.Line]; !seen && path != "" {
				paths[n.Line] = path
			}
		}
	}
	walk(&root, "")
	field, ok := paths[line]
	if !ok || field == "" {
		// An empty key ("": 1) has no path to name: report the decoder's
		// message as a parse error.
		return nil
	}
	reason := strings.TrimSpace(strings.TrimPrefix(msg, fmt.Sprintf("line %d:", line)))
	return &framework.ConfigError{Field: field, Reason: fmt.Sprintf("%s (line %d)", reason, line)}
}

// Decode decodes data over dst strictly: an unknown key, or a value of the
// wrong type, is a *framework.ConfigError naming its YAML path (see
// FieldError). Empty data leaves dst as it is.
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
