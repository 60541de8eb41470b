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
)

// TestQueueTypeSettings: AMQP_QUEUE_TYPE / amqp.queue_type and
// AMQP_DELIVERY_LIMIT / amqp.delivery_limit reach brokers.AMQPConfig, and their
// mistakes are named where they were made.
func TestQueueTypeSettings(t *testing.T) {
	t.Parallel()
	c, err := brokers.DefaultConfig().OverlayEnv(mapEnv(map[string]string{"AMQP_QUEUE_TYPE": "quorum", "AMQP_DELIVERY_LIMIT": "50"}))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	require.Equal(t, "quorum", c.AMQP.QueueType)
	require.Equal(t, 50, c.AMQP.DeliveryLimit)
	require.Contains(t, c.String(), `QueueType:"quorum" DeliveryLimit:50`)

	c, err = brokers.ParseConfig([]byte("amqp:\n  queue_type: quorum\n  delivery_limit: 7\n"))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	require.Equal(t, "quorum", c.AMQP.QueueType)
	require.Equal(t, 7, c.AMQP.DeliveryLimit)
	require.Equal(t, "classic", brokers.DefaultConfig().AMQP.QueueType, "the default is written out")

	for _, tc := range []struct {
		env   map[string]string
		yaml  string
		field string
		want  string
	}{
		// A delivery limit means nothing on a classic queue: an error,
		// named as the operator wrote it.
		{env: map[string]string{"AMQP_DELIVERY_LIMIT": "5"}, field: "AMQP_DELIVERY_LIMIT", want: "quorum queue setting"},
		{yaml: "amqp:\n  delivery_limit: 5\n", field: "amqp.delivery_limit", want: "quorum queue setting"},
		{yaml: "amqp:\n  queue_type: classic\n  delivery_limit: 5\n", field: "amqp.delivery_limit", want: "AMQP_QUEUE_TYPE"},
		{env: map[string]string{"AMQP_QUEUE_TYPE": "stream"}, field: "AMQP_QUEUE_TYPE", want: `"classic" or "quorum"`},
		{yaml: "amqp:\n  queue_type: Quorum\n", field: "amqp.queue_type", want: `got "Quorum"`},
		{env: map[string]string{"AMQP_DELIVERY_LIMIT": "0"}, field: "AMQP_DELIVERY_LIMIT", want: "positive integer"},
		{env: map[string]string{"AMQP_DELIVERY_LIMIT": "many"}, field: "AMQP_DELIVERY_LIMIT", want: "positive integer"},
		{yaml: "amqp:\n  queue_type: quorum\n  delivery_limit: -1\n", field: "amqp.delivery_limit", want: "negative"},
		{yaml: "amqp:\n  delivery_limit: lots\n", field: "amqp.delivery_limit", want: "line 2"},
		// One name per setting: the arguments these settings own are
		// refused in queue_arguments.
		{yaml: "amqp:\n  queue_arguments: {x-queue-type: quorum}\n", field: "amqp.queue_arguments", want: "queue_type"},
		{yaml: "amqp:\n  queue_type: quorum\n  queue_arguments: {x-delivery-limit: 3}\n", field: "amqp.queue_arguments", want: "delivery_limit"},
	} {
		c, err := brokers.ParseConfig([]byte(tc.yaml))
		if err == nil {
			c, err = c.OverlayEnv(mapEnv(tc.env))
		}
		if err == nil {
			err = c.Validate()
		}
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, "%v %q", tc.env, tc.yaml)
		require.Equal(t, tc.field, ce.Field, "%v", err)
		require.Contains(t, err.Error(), tc.want)
	}
	// A quorum queue with a dead-letter exchange: the arguments that are
	// not settings of their own still go through queue_arguments.
	c, err = brokers.ParseConfig([]byte("amqp:\n  queue_type: quorum\n  delivery_limit: 3\n  queue_arguments: {x-dead-letter-exchange: dlx}\n"))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
}

// TestSecretFiles: AMQP_URL_FILE and KAFKA_SASL_PASSWORD_FILE read a
// secret from a file (a mounted Docker or Kubernetes secret), trailing
// newline dropped; the value and the file's content never appear in an
// error or a printed config, and a value from a file is named by its
// _FILE variable.
func TestSecretFiles(t *testing.T) {
	t.Parallel()
	const pw = "file-S3cretMarker"
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	urlFile := write("amqp-url", "amqp://app:"+pw+"@rabbit:5672/prod\n")
	pwFile := write("sasl-pw", pw+"\n")

	c, err := brokers.DefaultConfig().OverlayEnv(mapEnv(map[string]string{
		"AMQP_URL_FILE": urlFile, "KAFKA_SASL_PASSWORD_FILE": pwFile,
		"KAFKA_SASL_MECHANISM": "PLAIN", "KAFKA_SASL_USER": "app",
	}))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	require.Equal(t, "amqp://app:"+pw+"@rabbit:5672/prod", c.AMQP.URL)
	require.Equal(t, pw, c.Kafka.SASL.Password)
	checkNoSecretIn(t, pw, c.String(), fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c))

	badURL := write("bad-url", "amqp://app:"+pw+"@rabbit:port/\n")
	for _, tc := range []struct {
		env   map[string]string
		field string
		want  string
	}{
		{map[string]string{"AMQP_URL_FILE": filepath.Join(dir, "missing")}, "AMQP_URL_FILE", "cannot read the file"},
		{map[string]string{"AMQP_URL_FILE": write("empty", "\n")}, "AMQP_URL_FILE", "is empty"},
		{map[string]string{"AMQP_URL_FILE": urlFile, "AMQP_URL": "amqp://x/"}, "AMQP_URL_FILE", "not both"},
		{map[string]string{"KAFKA_SASL_PASSWORD_FILE": pwFile, "KAFKA_SASL_PASSWORD": "pw"}, "KAFKA_SASL_PASSWORD_FILE", "not both"},
		// Validation names the _FILE variable the value came from, and
		// does not quote it.
		{map[string]string{"AMQP_URL_FILE": badURL}, "AMQP_URL_FILE", "not a valid URL"},
	} {
		c, err := brokers.DefaultConfig().OverlayEnv(mapEnv(tc.env))
		if err == nil {
			err = c.Validate()
		}
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, "%v", tc.env)
		require.Equal(t, tc.field, ce.Field, "%v", err)
		require.Contains(t, err.Error(), tc.want)
		checkNoSecretIn(t, pw, err.Error())
	}
}

// TestLoadConfigSection: LoadConfig reads YAML already in memory (the
// broker section of a larger file) like LoadConfig reads a file: the
// environment over it, validated, errors naming the path within it.
// Not parallel: t.Setenv.
func TestLoadConfigSection(t *testing.T) {
	clearEnv(t)
	c, err := brokers.LoadSection([]byte("amqp:\n  queue_type: quorum\n"))
	require.NoError(t, err)
	require.Equal(t, "quorum", c.AMQP.QueueType)

	t.Setenv("AMQP_DELIVERY_LIMIT", "9")
	c, err = brokers.LoadSection([]byte("amqp:\n  queue_type: quorum\n"))
	require.NoError(t, err)
	require.Equal(t, 9, c.AMQP.DeliveryLimit, "the environment wins")

	t.Setenv("AMQP_QUEUE_TYPE", "classic")
	_, err = brokers.LoadSection([]byte("amqp:\n  queue_type: quorum\n"))
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "AMQP_DELIVERY_LIMIT", ce.Field)

	clearEnv(t)
	_, err = brokers.LoadSection([]byte("amqp:\n  queue_typ: quorum\n"))
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "amqp.queue_typ", ce.Field)
	_, err = brokers.LoadSection([]byte("amqp: [\n"))
	require.Error(t, err)
}

func checkNoSecretIn(t *testing.T, secret string, texts ...string) {
	t.Helper()
	for _, s := range texts {
		require.False(t, strings.Contains(s, secret), "secret printed: %s", s)
	}
}
