package brokers_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
)

// busFactory is a registered kind "my-bus.v2" that needs option "region"
// (one of "eu", "us") to build anything.
// The kind TestOptionEnv reads, linked as an adapter package links its own.
func init() { brokers.Register("my-bus.v2", busFactory()) }

func busFactory() brokers.Factory {
	check := func(c brokers.Config) error {
		switch c.Options["region"] {
		case "eu", "us":
			return nil
		case "":
			return &framework.ConfigError{Field: "options.region", Reason: "is required"}
		}
		return &framework.ConfigError{Field: "options.region", Reason: "must be eu or us"}
	}
	return brokers.Factory{
		NewSubscriber: func(c brokers.Config, _ watermill.LoggerAdapter) (message.Subscriber, error) {
			if c.Options["group"] == "" {
				return nil, &framework.ConfigError{Field: "options.group", Reason: "is required to subscribe"}
			}
			return nil, os.ErrInvalid
		},
		NewPublisher: func(brokers.Config, watermill.LoggerAdapter) (message.Publisher, error) {
			return nil, os.ErrInvalid
		},
		Validate: check,
	}
}

// clearBusEnv unsets every variable of the kinds these tests use.
func clearBusEnv(t *testing.T) {
	t.Helper()
	clearEnv(t)
	testenv.UnsetEnvPrefix(t, "MY_BUS_V2_")
}

// TestOptionEnv: for a registered kind, LoadConfig
// copy <KIND>_<OPTION> variables into Options (the kind upper-cased, '.'
// and '-' as '_'; the option lower-cased), over the file's options:; a
// built-in kind gets none; errors about "options.<option>" name the
// variable, also for a required option left unset and for one a
// constructor refuses. Uses the real environment, so not parallel.
func TestOptionEnv(t *testing.T) {
	clearBusEnv(t)

	c := loadEnv(t, "BROKER=my-bus.v2", "MY_BUS_V2_REGION=eu", "MY_BUS_V2_CLIENT_NAME= billing ", "MY_BUS_V2_EMPTY=")
	require.Equal(t, map[string]string{"region": "eu", "client_name": "billing"}, c.Options)
	require.NoError(t, c.Validate())

	// Named after the variable: set and wrong, unset and required, and
	// refused by the constructor rather than by Validate.
	c = loadEnv(t, "MY_BUS_V2_REGION=mars")
	requireConfigField(t, c.Validate(), "MY_BUS_V2_REGION")
	c = loadEnv(t, "MY_BUS_V2_REGION=")
	requireConfigField(t, c.Validate(), "MY_BUS_V2_REGION")
	c = loadEnv(t, "MY_BUS_V2_REGION=us")
	_, err := brokers.NewSubscriber(c, nil)
	requireConfigField(t, err, "MY_BUS_V2_GROUP")

	// A built-in kind reads no prefixed options.
	c = loadEnv(t, "BROKER=amqp", "AMQP_REGION=eu")
	require.Empty(t, c.Options)

	// A file's options, overridden by the environment; errors about the
	// file's values name the YAML path.
	t.Setenv("BROKER", "")
	t.Setenv("MY_BUS_V2_CLIENT_NAME", "")
	path := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(path, []byte("kind: my-bus.v2\noptions:\n  region: us\n  group: g\n"), 0o600))
	t.Setenv("MY_BUS_V2_REGION", "eu")
	c, err = brokers.LoadConfig(path)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"region": "eu", "group": "g"}, c.Options)
	t.Setenv("MY_BUS_V2_REGION", "")
	require.NoError(t, os.WriteFile(path, []byte("kind: my-bus.v2\noptions:\n  region: mars\n"), 0o600))
	c, err = brokers.LoadConfig(path)
	require.NoError(t, err)
	requireConfigField(t, c.Validate(), "options.region")
	_, err = brokers.NewSubscriber(c, nil)
	requireConfigField(t, err, "options.region")
}

// TestOptionsRedacted: Config.String redacts Options values whose key
// names a secret and the password of URLs, because a registered kind's
// Factory has no say in how Config prints.
func TestOptionsRedacted(t *testing.T) {
	t.Parallel()
	c := brokers.Config{Kind: "my-bus", Options: map[string]string{
		"url": "nats://app:UrlPw@host:4222", "password": "Pw1", "api_token": "Tok1",
		"client_secret": "Sec1", "region": "eu",
	}}
	out := c.String()
	for _, s := range []string{"UrlPw", "Pw1", "Tok1", "Sec1"} {
		require.NotContains(t, out, s)
	}
	require.Contains(t, out, "region:eu")
	require.Contains(t, out, "nats://app:xxxxx@host:4222")
	require.Equal(t, "Pw1", c.Options["password"], "String does not change the config")
}

func requireConfigField(t *testing.T, err error, field string) {
	t.Helper()
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, field, ce.Field, "error: %v", err)
}
