package brokers

import "github.com/claimtx/claimtx/internal/config"

// Unexported entry points the black-box tests (the fuzz targets included)
// drive directly: users reach them through LoadConfig("") and
// LoadConfig.

// ParseConfig decodes YAML over the defaults, without the environment and
// without validating.
var ParseConfig = parseConfig

// DefaultConfig is what LoadConfig starts from.
var DefaultConfig = defaultConfig

// OverlayEnv applies the environment variables read through lookup.
func (c Config) OverlayEnv(lookup func(string) (string, bool)) (Config, error) {
	return c.overlayEnv(lookup)
}

// LoadSection is what framework/consumer reads its broker section with.
var LoadSection = config.LoadSection[Config]
