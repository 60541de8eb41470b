package brokers_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
)

// allEnv is every variable LoadConfig("") reads.
var allEnv = []string{
	"BROKER", "AMQP_URL", "CONCURRENCY", "AMQP_PREFETCH",
	"AMQP_WINDOW", "AMQP_NACK_DELAY", "AMQP_DIAL_TIMEOUT",
	"KAFKA_BROKERS", "KAFKA_CONSUMER_GROUP", "KAFKA_INITIAL_OFFSET",
	"KAFKA_VERSION", "KAFKA_CLIENT_ID", "KAFKA_SESSION_TIMEOUT",
	"KAFKA_REBALANCE_TIMEOUT", "KAFKA_NACK_DELAY", "KAFKA_WINDOW",
	"KAFKA_DIAL_TIMEOUT", "KAFKA_SASL_MECHANISM", "KAFKA_SASL_USER",
	"KAFKA_SASL_PASSWORD", "KAFKA_TLS", "KAFKA_TLS_CA_FILE",
	"KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE",
	"AMQP_QUEUE_TYPE", "AMQP_DELIVERY_LIMIT", "AMQP_URL_FILE", "KAFKA_SASL_PASSWORD_FILE",
}

// clearEnv unsets (sets empty, which counts as unset) every variable, so
// the runner's own environment cannot leak into a case.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, name := range allEnv {
		t.Setenv(name, "")
	}
}

// loadEnv sets each NAME=value of env and loads the config from the
// environment alone (LoadConfig("")), which must succeed.
func loadEnv(t *testing.T, env ...string) brokers.Config {
	t.Helper()
	testenv.SetEnv(t, env...)
	c, err := brokers.LoadConfig("")
	require.NoError(t, err)
	return c
}

// TestEnvErrorsNameTheVariable sets one bad variable at a time (with what
// it needs to be looked at) and checks that the error's Field is exactly
// the variable to change, whether parsing, Validate or the constructor
// refuses it. The operator never wrote "amqp.url"; they wrote AMQP_URL.
// Uses the real environment (t.Setenv), so it is not parallel.
func TestEnvErrorsNameTheVariable(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		env   []string // NAME=value pairs
		field string
		// subscriber: LoadConfig("") accepts it, brokers.NewSubscriber refuses.
		subscriber bool
	}{
		{env: []string{"BROKER=NATS"}, field: "BROKER"},
		{env: []string{"BROKER=nats"}, field: "BROKER", subscriber: true},
		{env: []string{"AMQP_URL=http://rabbit/"}, field: "AMQP_URL"},
		{env: []string{"AMQP_URL=amqp://u:p@rabbit:notaport/"}, field: "AMQP_URL"},
		{env: []string{"CONCURRENCY=abc"}, field: "CONCURRENCY"},
		{env: []string{"CONCURRENCY=5000"}, field: "CONCURRENCY"},
		{env: []string{"AMQP_PREFETCH=0"}, field: "AMQP_PREFETCH"},
		{env: []string{"AMQP_WINDOW=70000"}, field: "AMQP_WINDOW"},
		{env: []string{"AMQP_NACK_DELAY=soon"}, field: "AMQP_NACK_DELAY"},
		{env: []string{"AMQP_DIAL_TIMEOUT=30"}, field: "AMQP_DIAL_TIMEOUT"},
		{env: []string{"AMQP_QUEUE_TYPE=lazy"}, field: "AMQP_QUEUE_TYPE"},
		{env: []string{"AMQP_DELIVERY_LIMIT=3"}, field: "AMQP_DELIVERY_LIMIT"},
		{env: []string{"AMQP_QUEUE_TYPE=quorum", "AMQP_DELIVERY_LIMIT=-3"}, field: "AMQP_DELIVERY_LIMIT"},
		{env: []string{"AMQP_URL_FILE=" + missing}, field: "AMQP_URL_FILE"},
		{env: []string{"BROKER=kafka", "KAFKA_SASL_PASSWORD_FILE=" + missing}, field: "KAFKA_SASL_PASSWORD_FILE"},
		{env: []string{"BROKER=kafka", "KAFKA_BROKERS=nohost"}, field: "KAFKA_BROKERS"},
		{env: []string{"BROKER=kafka", "KAFKA_BROKERS= , "}, field: "KAFKA_BROKERS"},
		{env: []string{"BROKER=kafka", "KAFKA_INITIAL_OFFSET=latest"}, field: "KAFKA_INITIAL_OFFSET"},
		{env: []string{"BROKER=kafka", "KAFKA_VERSION=three"}, field: "KAFKA_VERSION"},
		{env: []string{"BROKER=kafka", "KAFKA_SESSION_TIMEOUT=10"}, field: "KAFKA_SESSION_TIMEOUT"},
		{env: []string{"BROKER=kafka", "KAFKA_SESSION_TIMEOUT=1us"}, field: "KAFKA_SESSION_TIMEOUT"},
		{env: []string{"BROKER=kafka", "KAFKA_REBALANCE_TIMEOUT=x"}, field: "KAFKA_REBALANCE_TIMEOUT"},
		{env: []string{"BROKER=kafka", "KAFKA_NACK_DELAY=x"}, field: "KAFKA_NACK_DELAY"},
		{env: []string{"BROKER=kafka", "KAFKA_WINDOW=-1"}, field: "KAFKA_WINDOW"},
		{env: []string{"BROKER=kafka", "KAFKA_DIAL_TIMEOUT=x"}, field: "KAFKA_DIAL_TIMEOUT"},
		{env: []string{"BROKER=kafka", "KAFKA_SASL_MECHANISM=GSSAPI", "KAFKA_SASL_USER=u"}, field: "KAFKA_SASL_MECHANISM"},
		// A variable left unset is named too: it is the one to set.
		{env: []string{"BROKER=kafka", "KAFKA_SASL_USER=u"}, field: "KAFKA_SASL_MECHANISM"},
		{env: []string{"BROKER=kafka", "KAFKA_SASL_PASSWORD=pw"}, field: "KAFKA_SASL_MECHANISM"},
		{env: []string{"BROKER=kafka", "KAFKA_SASL_MECHANISM=PLAIN"}, field: "KAFKA_SASL_USER"},
		{env: []string{"BROKER=kafka", "KAFKA_TLS=maybe"}, field: "KAFKA_TLS"},
		{env: []string{"BROKER=kafka", "KAFKA_TLS_CA_FILE=ca.pem"}, field: "KAFKA_TLS"},
		{env: []string{"BROKER=kafka", "KAFKA_TLS=true", "KAFKA_TLS_CERT_FILE=c.pem"}, field: "KAFKA_TLS_KEY_FILE"},
		{env: []string{"BROKER=kafka", "KAFKA_TLS=true", "KAFKA_TLS_KEY_FILE=k.pem"}, field: "KAFKA_TLS_CERT_FILE"},
		{env: []string{"BROKER=kafka", "KAFKA_CONSUMER_GROUP=g", "KAFKA_TLS=true", "KAFKA_TLS_CA_FILE=" + missing}, field: "KAFKA_TLS_CA_FILE", subscriber: true},
		{env: []string{"BROKER=kafka"}, field: "KAFKA_CONSUMER_GROUP", subscriber: true},
	} {
		t.Run(strings.Join(tc.env, ","), func(t *testing.T) {
			clearEnv(t)
			testenv.SetEnv(t, tc.env...)
			c, err := brokers.LoadConfig("")
			if tc.subscriber {
				require.NoError(t, err)
				_, err = brokers.NewSubscriber(c, nil)
			}
			var ce *framework.ConfigError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, tc.field, ce.Field, "%v", err)
			require.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf("claimtx: config field %q: ", tc.field)), err.Error())
		})
	}
}

// TestFileErrorsNameTheYAMLPath: with a file, a value the file set is named
// by its YAML path and a value a variable overrode by the variable.
func TestFileErrorsNameTheYAMLPath(t *testing.T) {
	clearEnv(t)
	path := filepath.Join(t.TempDir(), "brokers.yaml")
	require.NoError(t, os.WriteFile(path, []byte("kind: kafka\nkafka:\n  brokers: [nohost]\n  initial_offset: latest\n"), 0o600))
	_, err := brokers.LoadConfig(path)
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "kafka.brokers", ce.Field)

	t.Setenv("KAFKA_BROKERS", "k:9092")
	_, err = brokers.LoadConfig(path)
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "kafka.initial_offset", ce.Field, "the file's value, so its path")

	t.Setenv("KAFKA_BROKERS", "alsonohost")
	_, err = brokers.LoadConfig(path)
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "KAFKA_BROKERS", ce.Field, "the variable's value, so the variable")

	// No file and nothing set: a programmatic Config keeps its YAML paths.
	_, err = brokers.NewSubscriber(brokers.Config{Kind: brokers.KindKafka}, nil)
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "kafka.consumer_group", ce.Field)
}

// TestKafkaSubscriberNeedsGroup: built directly, with no group, a Kafka
// subscriber is refused (a shared default group would make services on one
// topic split it); a publisher needs none.
func TestKafkaSubscriberNeedsGroup(t *testing.T) {
	t.Parallel()
	cfg := brokers.Config{Kind: brokers.KindKafka}
	_, err := brokers.NewSubscriber(cfg, nil)
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "kafka.consumer_group", ce.Field)
	require.Contains(t, ce.Reason, "KAFKA_CONSUMER_GROUP")
	require.Equal(t, "", brokers.DefaultConfig().Kafka.ConsumerGroup, "no shared default")

	cfg.Kafka.ConsumerGroup = "billing"
	sub, err := brokers.NewSubscriber(cfg, nil)
	require.NoError(t, err, "NewSubscriber does not connect")
	require.NoError(t, sub.Close())
}

// TestYAMLErrorsNameThePath: a value the decoder refuses, or an unknown
// key, is a *ConfigError with the YAML path, like a Validate error.
func TestYAMLErrorsNameThePath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ yaml, field string }{
		{"amqp:\n  nack_delay: soon\n", "amqp.nack_delay"},
		{"amqp:\n  url: amqp://x/\n  concurrency: many\n", "amqp.concurrency"},
		{"kafka:\n  consumer_grup: typo\n", "kafka.consumer_grup"},
		{"kafka:\n  tls:\n    enabled: maybe\n", "kafka.tls.enabled"},
		{"kafka:\n  brokers:\n    - a:9092\n    - [b]\n", "kafka.brokers"},
		{"kind: [1, 2]\n", "kind"},
	} {
		_, err := brokers.ParseConfig([]byte(tc.yaml))
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, "%q", tc.yaml)
		require.Equal(t, tc.field, ce.Field, "%q: %v", tc.yaml, err)
		require.Contains(t, ce.Reason, "line ")
	}
}
