package nats_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/internal/testenv"
)

// clearNATSEnv unsets (sets empty, which counts as unset) every NATS_*
// variable and BROKER, so the runner's environment cannot leak in.
func clearNATSEnv(t *testing.T) {
	t.Helper()
	t.Setenv("BROKER", "")
	testenv.UnsetEnvPrefix(t, "NATS_")
}

// TestConfigFromEnv: BROKER=nats selects the kind and brokers.LoadConfig("")
// reads NATS_<SETTING> into Config.NATS; secrets are redacted when the
// config is printed.
// Uses the real environment (t.Setenv), so it is not parallel.
func TestConfigFromEnv(t *testing.T) {
	clearNATSEnv(t)
	t.Setenv("BROKER", "nats")
	t.Setenv("NATS_URL", "nats://app:UrlSecret@127.0.0.1:4222")
	t.Setenv("NATS_DURABLE", "loyalty")
	t.Setenv("NATS_ACK_WAIT", "5s")
	t.Setenv("NATS_MAX_DELIVER", "-1")
	t.Setenv("NATS_SUBJECT_PREFIX", "prod.")
	cfg, err := brokers.LoadConfig("")
	require.NoError(t, err)
	require.Equal(t, "nats", cfg.Kind)
	require.Equal(t, brokers.NATSConfig{
		URL: "nats://app:UrlSecret@127.0.0.1:4222", Durable: "loyalty", AckWait: 5 * time.Second, MaxDeliver: -1, SubjectPrefix: "prod.",
		MaxAckPending: 256, NackDelay: time.Second, Concurrency: 4, Streams: "create", DialTimeout: 30 * time.Second, // the defaults
	}, cfg.NATS)
	require.Empty(t, cfg.Options)
	require.NoError(t, cfg.Validate())
	require.NotContains(t, cfg.String(), "UrlSecret")

	t.Setenv("NATS_URL", "")
	t.Setenv("NATS_TOKEN", "TokSecret")
	cfg, err = brokers.LoadConfig("")
	require.NoError(t, err)
	require.Equal(t, "TokSecret", cfg.NATS.Token)
	require.NotContains(t, cfg.String(), "TokSecret")

	// A secret may come from a mounted file, as AMQP_URL_FILE does.
	file := filepath.Join(t.TempDir(), "password")
	require.NoError(t, os.WriteFile(file, []byte("FilePw\n"), 0o600))
	t.Setenv("NATS_TOKEN", "")
	t.Setenv("NATS_USER", "app")
	t.Setenv("NATS_PASSWORD_FILE", file)
	cfg, err = brokers.LoadConfig("")
	require.NoError(t, err)
	require.Equal(t, "FilePw", cfg.NATS.Password)
	require.NotContains(t, fmt.Sprintf("%#v %+v", cfg, cfg.NATS), "FilePw")
}

// TestEnvErrorsNameTheVariable: a bad or missing setting that came from
// (or belongs in) the environment is a *framework.ConfigError naming the
// variable, whether Validate or the constructor refuses it; from a file it
// names the YAML path.
func TestEnvErrorsNameTheVariable(t *testing.T) {
	for _, tc := range []struct {
		env        []string
		field      string
		subscriber bool // only the subscriber refuses it
	}{
		{env: []string{"NATS_ACK_WAIT=soon"}, field: "NATS_ACK_WAIT"},
		{env: []string{"NATS_ACK_WAIT=10ms"}, field: "NATS_ACK_WAIT"},
		{env: []string{"NATS_MAX_DELIVER=0"}, field: "NATS_MAX_DELIVER"},
		{env: []string{"NATS_MAX_ACK_PENDING=-3"}, field: "NATS_MAX_ACK_PENDING"},
		{env: []string{"NATS_NACK_DELAY=later"}, field: "NATS_NACK_DELAY"},
		{env: []string{"NATS_CONCURRENCY=0"}, field: "NATS_CONCURRENCY"},
		{env: []string{"NATS_STREAMS=maybe"}, field: "NATS_STREAMS"},
		{env: []string{"NATS_URL=http://127.0.0.1:4222"}, field: "NATS_URL"},
		{env: []string{"NATS_DURABLE=has.dot"}, field: "NATS_DURABLE"},
		{env: []string{"NATS_SUBJECT_PREFIX=a b"}, field: "NATS_SUBJECT_PREFIX"},
		{env: []string{"NATS_CREDS_FILE=/nonexistent/claimtx.creds"}, field: "NATS_CREDS_FILE"},
		{env: []string{"NATS_PASSWORD=x"}, field: "NATS_USER"},
		{env: []string{"NATS_ACKWAIT=5s"}, field: "NATS_ACKWAIT"}, // a typo is not ignored
		{env: nil, field: "NATS_DURABLE", subscriber: true},
	} {
		t.Run(tc.field+"/"+strings.Join(tc.env, ","), func(t *testing.T) {
			clearNATSEnv(t)
			t.Setenv("BROKER", "nats")
			t.Setenv("NATS_URL", "nats://127.0.0.1:1") // nothing connects: refused before
			t.Setenv("NATS_DIAL_TIMEOUT", "-1s")
			testenv.SetEnv(t, tc.env...)
			cfg, err := brokers.LoadConfig("")
			if err != nil { // a value that does not parse, or fails the kind's checks
				requireField(t, err, tc.field)
				return
			}
			if tc.subscriber {
				require.NoError(t, cfg.Validate())
				_, err = brokers.NewSubscriber(cfg, nil)
			} else {
				err = cfg.Validate()
				require.Error(t, err)
				_, perr := brokers.NewPublisher(cfg, nil)
				requireField(t, perr, tc.field)
			}
			requireField(t, err, tc.field)
		})
	}
}

// TestConfigFile: nats: in a configuration file configures the kind;
// the environment overrides them; errors about the file's values name the
// YAML path.
func TestConfigFile(t *testing.T) {
	clearNATSEnv(t)
	path := filepath.Join(t.TempDir(), "claimtx.yaml")
	write := func(body string) {
		require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	}
	write("kind: nats\nnats:\n  url: nats://127.0.0.1:4222\n  durable: billing\n  ack_wait: 5s\n  max_deliver: -1\n")
	t.Setenv("NATS_ACK_WAIT", "9s")
	cfg, err := brokers.LoadConfig(path)
	require.NoError(t, err)
	require.Equal(t, 9*time.Second, cfg.NATS.AckWait, "the environment overrides the file")
	require.Equal(t, "billing", cfg.NATS.Durable)
	require.Equal(t, -1, cfg.NATS.MaxDeliver)
	require.NoError(t, cfg.Validate())

	t.Setenv("NATS_ACK_WAIT", "")
	write("kind: nats\nnats:\n  max_deliver: often\n")
	_, err = brokers.LoadConfig(path)
	requireField(t, err, "nats.max_deliver")
	write("kind: nats\nnats:\n  max_deliver: -2\n")
	_, err = brokers.LoadConfig(path)
	requireField(t, err, "nats.max_deliver")
	write("kind: nats\nnats:\n  subject_prefix: a b\n")
	_, err = brokers.LoadConfig(path)
	requireField(t, err, "nats.subject_prefix")
}
