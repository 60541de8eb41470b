package framework

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
)

var extractorName = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,62}$`)

// specRegistry is the machinery shared by KeyRegistry and TimeRegistry:
// named factories resolved from "NAME" or "NAME:ARG" specs, safe for
// concurrent use, refusing duplicate names.
type specRegistry[F any] struct {
	mu        sync.RWMutex
	factories map[string]func(arg string) (F, error)
	// noun names the extractors in errors ("extractor", "event time
	// extractor"); spec names the spec ("key spec") and field the config
	// field ("key", "event_time"); examples lists sample specs.
	noun, unknown, spec, field, examples string
}

func newSpecRegistry[F any](builtins map[string]func(string) (F, error), noun, unknown, spec, field, examples string) *specRegistry[F] {
	r := &specRegistry[F]{factories: make(map[string]func(string) (F, error), len(builtins)),
		noun: noun, unknown: unknown, spec: spec, field: field, examples: examples}
	for n, f := range builtins {
		r.factories[n] = f
	}
	return r
}

func (r *specRegistry[F]) register(name string, f func(string) (F, error)) error {
	if !extractorName.MatchString(name) {
		return &ConfigError{Field: "name", Reason: fmt.Sprintf("%s name %q must match %s", r.noun, name, extractorName)}
	}
	if f == nil {
		return &ConfigError{Field: "factory", Reason: fmt.Sprintf("%s %q has a nil factory", r.noun, name)}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.factories[name]; dup {
		return &ConfigError{Field: "name", Reason: fmt.Sprintf("%s %q is already registered", r.noun, name)}
	}
	r.factories[name] = f
	return nil
}

// parse resolves spec; isNil guards against factories returning a nil
// function, which a generic F cannot compare with nil itself.
func (r *specRegistry[F]) parse(spec string, isNil func(F) bool) (F, error) {
	var zero F
	name, arg, _ := strings.Cut(strings.TrimSpace(spec), ":")
	if name == "" {
		return zero, &ConfigError{Field: r.field, Reason: fmt.Sprintf("%s is empty (e.g. %s)", r.spec, r.examples)}
	}
	r.mu.RLock()
	f, ok := r.factories[name]
	r.mu.RUnlock()
	if !ok {
		return zero, &ConfigError{Field: r.field, Reason: fmt.Sprintf("unknown %s %q in spec %q (known: %s)", r.unknown, name, spec, strings.Join(r.names(), ", "))}
	}
	v, err := f(arg)
	if err != nil {
		return zero, err
	}
	if isNil(v) {
		return zero, &ConfigError{Field: r.field, Reason: fmt.Sprintf("%s %q returned a nil function for %q", r.noun, name, arg)}
	}
	return v, nil
}

func (r *specRegistry[F]) names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.factories))
	for n := range r.factories {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
