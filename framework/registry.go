package framework

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// KeyFactory builds a KeyFunc from a key spec's argument ("event_id" in
// "metadata:event_id"), or returns a *ConfigError.
type KeyFactory func(arg string) (KeyFunc, error)

// TimeFactory builds a TimeFunc from an event-time spec's argument, or
// returns a *ConfigError.
type TimeFactory func(arg string) (TimeFunc, error)

// Registry resolves key and event-time specs ("NAME" or "NAME:ARG") to the
// built-in extractors and those registered on it, so that configuration can
// name a custom one. The zero value, like NewRegistry's, holds the
// built-ins only. It is safe for concurrent use.
type Registry struct {
	mu    sync.RWMutex
	keys  map[string]KeyFactory
	times map[string]TimeFactory
}

// NewRegistry returns a registry holding only the built-in extractors.
func NewRegistry() *Registry { return &Registry{} }

var builtins Registry // nothing registers on it

// ParseKeySpec resolves a key spec with the built-in extractors only. Use a
// Registry to resolve names of your own.
func ParseKeySpec(spec string) (KeyFunc, error) { return builtins.ParseKey(spec) }

// ParseTimeSpec resolves an event-time spec with the built-in extractors
// only. Use a Registry to resolve names of your own.
func ParseTimeSpec(spec string) (TimeFunc, error) { return builtins.ParseTime(spec) }

// RegisterKey adds a named key extractor: spec "NAME" or "NAME:ARG"
// resolves to f(ARG). Names match [a-z][a-z0-9_.-]*; registering a name
// twice, or a built-in one, is an error, so two packages cannot silently
// fight over one spec.
func (r *Registry) RegisterKey(name string, f KeyFactory) error {
	return register(r, &r.keys, keyKind(r), name, f)
}

// RegisterTime adds a named event-time extractor, under the same rules as
// RegisterKey.
func (r *Registry) RegisterTime(name string, f TimeFactory) error {
	return register(r, &r.times, timeKind, name, f)
}

// ParseKey turns a key spec "NAME" or "NAME:ARG" into a KeyFunc. The
// argument is everything after the first colon.
func (r *Registry) ParseKey(spec string) (KeyFunc, error) {
	return parse(r, &r.keys, keyKind(r), spec)
}

// ParseTime turns an event-time spec "NAME" or "NAME:ARG" into a
// TimeFunc.
func (r *Registry) ParseTime(spec string) (TimeFunc, error) {
	return parse(r, &r.times, timeKind, spec)
}

var extractorName = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,62}$`)

// specKind is one kind of extractor, with the words its errors use.
type specKind[F ~func(string) (G, error), G ~func(*message.Message) (R, error), R any] struct {
	builtins                             map[string]F
	noun, unknown, spec, field, examples string
}

// keyKind is a function so that first:, which calls back into ParseKey,
// makes no initialization cycle.
func keyKind(r *Registry) specKind[KeyFactory, KeyFunc, string] {
	return specKind[KeyFactory, KeyFunc, string]{
		builtins: map[string]KeyFactory{"metadata": fromMetadata, "json": fromJSON, "template": fromTemplate, "first": r.parseFirst},
		noun:     "extractor", unknown: "key extractor", spec: "key spec", field: "key",
		examples: "metadata:event_id, json:order_id, template:..., first:SPEC|SPEC",
	}
}

var timeKind = specKind[TimeFactory, TimeFunc, time.Time]{
	builtins: map[string]TimeFactory{"metadata": timeFromMetadata, "json": timeFromJSON, "kafka": timeFromKafka},
	noun:     "event time extractor", unknown: "event time extractor", spec: "event time spec", field: "event_time",
	examples: "metadata:event_time, json:occurred_at, kafka:timestamp",
}

func register[F ~func(string) (G, error), G ~func(*message.Message) (R, error), R any](r *Registry, m *map[string]F, k specKind[F, G, R], name string, f F) error {
	if f == nil {
		return &ConfigError{Field: "factory", Reason: fmt.Sprintf("%s %q has a nil factory", k.noun, name)}
	}
	if !extractorName.MatchString(name) {
		return &ConfigError{Field: "name", Reason: fmt.Sprintf("%s name %q must match %s", k.noun, name, extractorName)}
	}
	if k.builtins[name] != nil {
		return &ConfigError{Field: "name", Reason: fmt.Sprintf("%s %q is built in", k.noun, name)}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := (*m)[name]; dup {
		return &ConfigError{Field: "name", Reason: fmt.Sprintf("%s %q is already registered", k.noun, name)}
	}
	if *m == nil {
		*m = make(map[string]F)
	}
	(*m)[name] = f
	return nil
}

func parse[F ~func(string) (G, error), G ~func(*message.Message) (R, error), R any](r *Registry, m *map[string]F, k specKind[F, G, R], spec string) (G, error) {
	name, arg, _ := strings.Cut(strings.TrimSpace(spec), ":")
	if name == "" {
		return nil, &ConfigError{Field: k.field, Reason: fmt.Sprintf("%s is empty (e.g. %s)", k.spec, k.examples)}
	}
	f := k.builtins[name]
	if f == nil {
		r.mu.RLock()
		f = (*m)[name]
		names := slices.AppendSeq(slices.Collect(maps.Keys(k.builtins)), maps.Keys(*m))
		r.mu.RUnlock()
		if f == nil {
			slices.Sort(names)
			return nil, &ConfigError{Field: k.field, Reason: fmt.Sprintf("unknown %s %q in spec %q (known: %s)", k.unknown, name, spec, strings.Join(names, ", "))}
		}
	}
	v, err := f(arg)
	if err != nil {
		return nil, err
	}
	if v == nil {
		return nil, &ConfigError{Field: k.field, Reason: fmt.Sprintf("%s %q returned a nil function for %q", k.noun, name, arg)}
	}
	return v, nil
}

// parseFirst builds first: from "SPEC|SPEC|...", each resolved by r. A
// template holding '|' cannot be an alternative.
func (r *Registry) parseFirst(arg string) (KeyFunc, error) {
	alts := strings.Split(arg, "|")
	fs := make([]KeyFunc, 0, len(alts))
	for i, a := range alts {
		a = strings.TrimSpace(a)
		if a == "" {
			return nil, &ConfigError{Field: "key", Reason: fmt.Sprintf("first: alternative %d of %q is empty (want first:SPEC|SPEC...)", i, arg)}
		}
		if name, _, _ := strings.Cut(a, ":"); name == "first" {
			return nil, &ConfigError{Field: "key", Reason: fmt.Sprintf("first: alternative %q nests first:; list its alternatives directly", a)}
		}
		f, err := r.ParseKey(a)
		if err != nil {
			return nil, err
		}
		fs = append(fs, f)
	}
	return firstNonEmpty(fs...), nil
}
