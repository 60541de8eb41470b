package framework

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// KeyFactory builds a KeyFunc from the argument part of a key spec
// ("event_id" in "metadata:event_id"). It returns a *ConfigError for an
// argument it cannot use.
type KeyFactory func(arg string) (KeyFunc, error)

// TimeFactory builds a TimeFunc from the argument part of an event-time
// spec ("event_time" in "metadata:event_time"). It returns a *ConfigError
// for an argument it cannot use.
type TimeFactory func(arg string) (TimeFunc, error)

// Registry resolves key and event-time specs ("NAME" or "NAME:ARG") to
// extractors: the built-ins (see the package documentation) and the ones
// registered on it. It exists so that configuration (env, YAML) can name a
// custom extractor; build one per program, register your extractors, and
// parse specs with it. The zero value holds the built-ins only, as does
// NewRegistry. It is safe for concurrent use.
type Registry struct {
	mu    sync.RWMutex
	keys  map[string]KeyFactory
	times map[string]TimeFactory
}

// NewRegistry returns a registry holding only the built-in extractors.
func NewRegistry() *Registry { return &Registry{} }

// builtins resolves the package-level ParseKeySpec and ParseTimeSpec.
// Nothing registers on it, so it never changes.
var builtins Registry

// ParseKeySpec resolves a key spec with the built-in extractors only. Use a
// Registry to resolve names of your own.
func ParseKeySpec(spec string) (KeyFunc, error) { return builtins.ParseKey(spec) }

// ParseTimeSpec resolves an event-time spec with the built-in extractors
// only. Use a Registry to resolve names of your own.
func ParseTimeSpec(spec string) (TimeFunc, error) { return builtins.ParseTime(spec) }

// RegisterKey adds a named key extractor, so that a spec "NAME" or
// "NAME:ARG" resolves to f(ARG). Names are lower-case
// ([a-z][a-z0-9_.-]*); registering a name twice, or a built-in name, is an
// error so that two packages cannot silently fight over one spec.
func (r *Registry) RegisterKey(name string, f KeyFactory) error {
	if f == nil {
		return &ConfigError{Field: "factory", Reason: fmt.Sprintf("extractor %q has a nil factory", name)}
	}
	return register(r, &r.keys, keyKind(r), name, f)
}

// RegisterTime adds a named event-time extractor, under the same rules as
// RegisterKey.
func (r *Registry) RegisterTime(name string, f TimeFactory) error {
	if f == nil {
		return &ConfigError{Field: "factory", Reason: fmt.Sprintf("event time extractor %q has a nil factory", name)}
	}
	return register(r, &r.times, timeKind(), name, f)
}

// ParseKey turns a key spec "NAME" or "NAME:ARG" into a KeyFunc.
// Everything after the first colon is the argument, so templates may
// contain colons.
func (r *Registry) ParseKey(spec string) (KeyFunc, error) {
	return parse(r, &r.keys, keyKind(r), spec, func(f KeyFunc) bool { return f == nil })
}

// ParseTime turns an event-time spec "NAME" or "NAME:ARG" into a
// TimeFunc.
func (r *Registry) ParseTime(spec string) (TimeFunc, error) {
	return parse(r, &r.times, timeKind(), spec, func(f TimeFunc) bool { return f == nil })
}

var extractorName = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,62}$`)

// specKind describes one kind of extractor for the shared registry logic.
type specKind[F ~func(string) (G, error), G any] struct {
	// builtins are the built-in factories by name.
	builtins map[string]F
	// noun names the extractors in errors ("extractor", "event time
	// extractor"); unknown is the noun of an unknown name, spec names the
	// spec ("key spec") and field the config field ("key", "event_time");
	// examples lists sample specs.
	noun, unknown, spec, field, examples string
}

// keyKind and timeKind are functions, not variables, so that first:, which
// calls back into ParseKey, does not make an initialization cycle.
func keyKind(r *Registry) specKind[KeyFactory, KeyFunc] {
	return specKind[KeyFactory, KeyFunc]{
		// first: resolves its alternatives with r.
		builtins: map[string]KeyFactory{"metadata": fromMetadata, "json": fromJSON, "template": fromTemplate, "first": r.parseFirst},
		noun:     "extractor", unknown: "key extractor", spec: "key spec", field: "key",
		examples: "metadata:event_id, json:order_id, template:..., first:SPEC|SPEC",
	}
}

func timeKind() specKind[TimeFactory, TimeFunc] {
	return specKind[TimeFactory, TimeFunc]{
		builtins: map[string]TimeFactory{"metadata": timeFromMetadata, "json": timeFromJSON, "kafka": timeFromKafka},
		noun:     "event time extractor", unknown: "event time extractor", spec: "event time spec", field: "event_time",
		examples: "metadata:event_time, json:occurred_at, kafka:timestamp",
	}
}

func register[F ~func(string) (G, error), G any](r *Registry, m *map[string]F, k specKind[F, G], name string, f F) error {
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

// parse resolves spec; isNil guards against factories returning a nil
// function, which a generic G cannot compare with nil itself.
func parse[F ~func(string) (G, error), G any](r *Registry, m *map[string]F, k specKind[F, G], spec string, isNil func(G) bool) (G, error) {
	var zero G
	name, arg, _ := strings.Cut(strings.TrimSpace(spec), ":")
	if name == "" {
		return zero, &ConfigError{Field: k.field, Reason: fmt.Sprintf("%s is empty (e.g. %s)", k.spec, k.examples)}
	}
	f := k.builtins[name]
	if f == nil {
		r.mu.RLock()
		f = (*m)[name]
		names := slices.Collect(maps.Keys(k.builtins))
		for n := range *m {
			names = append(names, n)
		}
		r.mu.RUnlock()
		if f == nil {
			slices.Sort(names)
			return zero, &ConfigError{Field: k.field, Reason: fmt.Sprintf("unknown %s %q in spec %q (known: %s)", k.unknown, name, spec, strings.Join(names, ", "))}
		}
	}
	v, err := f(arg)
	if err != nil {
		return zero, err
	}
	if isNil(v) {
		return zero, &ConfigError{Field: k.field, Reason: fmt.Sprintf("%s %q returned a nil function for %q", k.noun, name, arg)}
	}
	return v, nil
}

// firstSeparator separates the alternatives of a first: spec. Keys rarely
// contain it, and templates that do cannot be an alternative.
const firstSeparator = "|"

// parseFirst builds the first: extractor from "SPEC|SPEC|...", each SPEC
// resolved by r (built-in or registered), first: excepted.
func (r *Registry) parseFirst(arg string) (KeyFunc, error) {
	alts := strings.Split(arg, firstSeparator)
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
