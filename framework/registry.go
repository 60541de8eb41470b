package framework

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// KeyFactory builds a KeyFunc from the argument part of a key spec
// ("event_id" in "metadata:event_id"). It returns a *ConfigError for an
// argument it cannot use.
type KeyFactory func(arg string) (KeyFunc, error)

// KeyRegistry maps extractor names to factories so that configuration can
// choose an extractor by a spec string such as "metadata:event_id",
// "json:order_id", "template:order-completed:{payload.order_id}" or a name
// users registered. It is safe for concurrent use.
type KeyRegistry struct {
	mu        sync.RWMutex
	factories map[string]KeyFactory
}

var builtinKeyExtractors = map[string]KeyFactory{
	"metadata": FromMetadata,
	"json":     FromJSON,
	"template": Template,
}

// NewKeyRegistry returns a registry holding the built-in extractors
// metadata, json and template.
func NewKeyRegistry() *KeyRegistry {
	r := &KeyRegistry{factories: make(map[string]KeyFactory, len(builtinKeyExtractors))}
	for n, f := range builtinKeyExtractors {
		r.factories[n] = f
	}
	return r
}

var extractorName = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,62}$`)

// Register adds a named extractor. Names are lower-case ([a-z][a-z0-9_.-]*);
// registering a name twice, or a built-in name, is an error so that two
// packages cannot silently fight over one spec.
func (r *KeyRegistry) Register(name string, f KeyFactory) error {
	if !extractorName.MatchString(name) {
		return &ConfigError{Field: "name", Reason: fmt.Sprintf("extractor name %q must match %s", name, extractorName)}
	}
	if f == nil {
		return &ConfigError{Field: "factory", Reason: fmt.Sprintf("extractor %q has a nil factory", name)}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.factories[name]; dup {
		return &ConfigError{Field: "name", Reason: fmt.Sprintf("extractor %q is already registered", name)}
	}
	r.factories[name] = f
	return nil
}

// Parse turns a spec "NAME" or "NAME:ARG" into a KeyFunc. Everything after
// the first colon is the argument, so templates may contain colons.
func (r *KeyRegistry) Parse(spec string) (KeyFunc, error) {
	name, arg, _ := strings.Cut(strings.TrimSpace(spec), ":")
	if name == "" {
		return nil, &ConfigError{Field: "key", Reason: "key spec is empty (e.g. metadata:event_id, json:order_id, template:...)"}
	}
	r.mu.RLock()
	f, ok := r.factories[name]
	r.mu.RUnlock()
	if !ok {
		return nil, &ConfigError{Field: "key", Reason: fmt.Sprintf("unknown key extractor %q in spec %q (known: %s)", name, spec, strings.Join(r.Names(), ", "))}
	}
	kf, err := f(arg)
	if err != nil {
		return nil, err
	}
	if kf == nil {
		return nil, &ConfigError{Field: "key", Reason: fmt.Sprintf("extractor %q returned a nil KeyFunc for %q", name, arg)}
	}
	return kf, nil
}

// Names lists the registered extractor names, sorted.
func (r *KeyRegistry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.factories))
	for n := range r.factories {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// DefaultKeys is the registry used by RegisterKeyExtractor and ParseKeySpec,
// and by configuration loaded with claimtx's config helpers.
var DefaultKeys = NewKeyRegistry()

// RegisterKeyExtractor adds a named extractor to DefaultKeys, typically from
// an init function, so that configuration can say `key: NAME` or
// `key: NAME:ARG`.
func RegisterKeyExtractor(name string, f KeyFactory) error {
	return DefaultKeys.Register(name, f)
}

// RegisterKeyFunc registers a KeyFunc that takes no argument under name.
func RegisterKeyFunc(name string, kf KeyFunc) error {
	if kf == nil {
		return &ConfigError{Field: "keyFunc", Reason: fmt.Sprintf("extractor %q has a nil KeyFunc", name)}
	}
	return DefaultKeys.Register(name, func(arg string) (KeyFunc, error) {
		if arg != "" {
			return nil, &ConfigError{Field: "key", Reason: fmt.Sprintf("extractor %q takes no argument, got %q", name, arg)}
		}
		return kf, nil
	})
}

// ParseKeySpec resolves a spec against DefaultKeys.
func ParseKeySpec(spec string) (KeyFunc, error) {
	return DefaultKeys.Parse(spec)
}
