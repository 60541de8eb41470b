package framework

import (
	"fmt"
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
	reg *specRegistry[KeyFunc]
}

// NewKeyRegistry returns a registry holding the built-in extractors
// metadata, json and template.
func NewKeyRegistry() *KeyRegistry {
	return &KeyRegistry{reg: newSpecRegistry(map[string]func(string) (KeyFunc, error){
		"metadata": FromMetadata,
		"json":     FromJSON,
		"template": Template,
	}, "extractor", "key extractor", "key spec", "key", "metadata:event_id, json:order_id, template:...")}
}

// Register adds a named extractor. Names are lower-case ([a-z][a-z0-9_.-]*);
// registering a name twice, or a built-in name, is an error so that two
// packages cannot silently fight over one spec.
func (r *KeyRegistry) Register(name string, f KeyFactory) error { return r.reg.register(name, f) }

// Parse turns a spec "NAME" or "NAME:ARG" into a KeyFunc. Everything after
// the first colon is the argument, so templates may contain colons.
func (r *KeyRegistry) Parse(spec string) (KeyFunc, error) {
	return r.reg.parse(spec, func(f KeyFunc) bool { return f == nil })
}

// Names lists the registered extractor names, sorted.
func (r *KeyRegistry) Names() []string { return r.reg.names() }

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
