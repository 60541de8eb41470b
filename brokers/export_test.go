package brokers

// Unexported entry points the black-box tests (the fuzz targets included)
// drive directly: users reach them through ConfigFromEnv and
// LoadConfigFile.

// ParseConfig decodes YAML over the defaults, without the environment and
// without validating.
var ParseConfig = parseConfig

// DefaultConfig is what ConfigFromEnv and LoadConfigFile start from.
var DefaultConfig = defaultConfig

// OverlayEnv applies the environment variables read through lookup.
func (c Config) OverlayEnv(lookup func(string) (string, bool)) (Config, error) {
	return c.overlayEnv(lookup)
}
