package brokers_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/amqp"  // registers the kind
	_ "github.com/claimtx/claimtx/brokers/kafka" // registers the kind
	"github.com/claimtx/claimtx/framework"
)

func mapEnv(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func TestDefaultConfig(t *testing.T) {
	t.Parallel()
	c := brokers.DefaultConfig()
	require.NoError(t, c.Validate())
	require.Equal(t, "amqp", c.Kind)
	require.Equal(t, "amqp://guest:guest@127.0.0.1:5672/", c.AMQP.URL)
	require.Equal(t, 4, c.AMQP.Concurrency)
	require.Equal(t, []string{"127.0.0.1:9092"}, c.Kafka.Brokers)
	require.Equal(t, "oldest", c.Kafka.InitialOffset)
	require.Equal(t, "3.6.0", c.Kafka.Version)
	require.Equal(t, 100*time.Millisecond, c.Kafka.MaxWaitTime)
	require.NoError(t, brokers.Config{}.Validate(), "the zero Config is valid")
}

func TestOverlayEnv(t *testing.T) {
	t.Parallel()
	c, err := brokers.DefaultConfig().OverlayEnv(mapEnv(map[string]string{
		"BROKER":                "kafka",
		"AMQP_URL":              "amqp://u:p@rabbit:5672/vh",
		"CONCURRENCY":           "8",
		"AMQP_NACK_DELAY":       "2s",
		"AMQP_WINDOW":           "512",
		"KAFKA_WINDOW":          "64",
		"KAFKA_BROKERS":         " k1:9092, k2:9093 ,,",
		"KAFKA_CONSUMER_GROUP":  "orders",
		"KAFKA_INITIAL_OFFSET":  "newest",
		"KAFKA_SESSION_TIMEOUT": "1500ms",
		"KAFKA_SASL_MECHANISM":  "SCRAM-SHA-512",
		"KAFKA_SASL_USER":       "svc",
		"KAFKA_SASL_PASSWORD":   "pw",
		"KAFKA_TLS":             "true",
		"KAFKA_CLIENT_ID":       "", // empty counts as unset
		"UNRELATED":             "x",
	}))
	require.NoError(t, err)
	require.NoError(t, c.Validate(), "a shorter session also shortens the derived heartbeat")
	require.Equal(t, "kafka", c.Kind)
	require.Equal(t, "amqp://u:p@rabbit:5672/vh", c.AMQP.URL)
	require.Equal(t, 8, c.AMQP.Concurrency)
	require.Equal(t, 2*time.Second, c.AMQP.NackDelay)
	require.Equal(t, 512, c.AMQP.Window)
	require.Equal(t, 64, c.Kafka.Window)
	require.Equal(t, []string{"k1:9092", "k2:9093"}, c.Kafka.Brokers)
	require.Equal(t, "orders", c.Kafka.ConsumerGroup)
	require.Equal(t, "newest", c.Kafka.InitialOffset)
	require.Equal(t, 1500*time.Millisecond, c.Kafka.SessionTimeout)
	require.Equal(t, brokers.KafkaSASLConfig{Mechanism: "SCRAM-SHA-512", User: "svc", Password: "pw"}, c.Kafka.SASL)
	require.True(t, c.Kafka.TLS.Enabled)
	require.Equal(t, "claimtx", c.Kafka.ClientID)
}

func TestOverlayEnvBad(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env   map[string]string
		field string
	}{
		{map[string]string{"CONCURRENCY": "many"}, "CONCURRENCY"},
		{map[string]string{"CONCURRENCY": "-1"}, "CONCURRENCY"},
		{map[string]string{"AMQP_NACK_DELAY": "1 minute"}, "AMQP_NACK_DELAY"},
		{map[string]string{"KAFKA_BROKERS": " , "}, "KAFKA_BROKERS"},
		{map[string]string{"KAFKA_TLS": "yes please"}, "KAFKA_TLS"},
		{map[string]string{"KAFKA_SESSION_TIMEOUT": "10"}, "KAFKA_SESSION_TIMEOUT"},
	} {
		_, err := brokers.DefaultConfig().OverlayEnv(mapEnv(tc.env))
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, "%v", tc.env)
		require.Equal(t, tc.field, ce.Field)
		require.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf("claimtx: config field %q: ", tc.field)), err.Error())
		require.NotContains(t, err.Error(), ".", "names the variable only, not also the YAML path: %v", err)
	}
}

// TestConfigFromEnv uses the real environment, so it cannot run in
// parallel (t.Setenv).
func TestConfigFromEnv(t *testing.T) {
	c := loadEnv(t, "BROKER=kafka", "KAFKA_BROKERS=127.0.0.1:19092", "KAFKA_CONSUMER_GROUP=from-env", "CONCURRENCY=2")
	require.Equal(t, "kafka", c.Kind)
	require.Equal(t, []string{"127.0.0.1:19092"}, c.Kafka.Brokers)
	require.Equal(t, "from-env", c.Kafka.ConsumerGroup)
	require.Equal(t, 2, c.AMQP.Concurrency)

	// A kind that cannot be a kind name is refused at once; a well-formed
	// one that is not linked only by Validate and the constructors, naming
	// the variable.
	t.Setenv("BROKER", "Carrier Pigeon")
	_, err := brokers.LoadConfig("")
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "BROKER", ce.Field)
	require.ErrorIs(t, err, brokers.ErrInvalidKind)
	c = loadEnv(t, "BROKER=carrier-pigeon")
	for _, err := range []error{c.Validate(), func() error { _, err := brokers.NewSubscriber(c, nil); return err }()} {
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "BROKER", ce.Field)
		require.ErrorIs(t, err, brokers.ErrInvalidKind)
		require.ErrorContains(t, err, "amqp, gochannel, kafka", "the error lists the kinds there are")
	}

	// The file says amqp; the environment wins.
	path := filepath.Join(t.TempDir(), "brokers.yaml")
	require.NoError(t, os.WriteFile(path, []byte("kind: amqp\nkafka:\n  consumer_group: from-file\n"), 0o600))
	t.Setenv("BROKER", "kafka")
	t.Setenv("KAFKA_CONSUMER_GROUP", "")
	c, err = brokers.LoadConfig(path)
	require.NoError(t, err)
	require.Equal(t, "kafka", c.Kind)
	require.Equal(t, "from-file", c.Kafka.ConsumerGroup)
}

func TestParseConfig(t *testing.T) {
	t.Parallel()
	c, err := brokers.ParseConfig([]byte(`
kind: kafka
amqp:
  url: amqp://app:pw@rabbit:5672/
  concurrency: 16
  nack_delay: 250ms
  queue_arguments:
    x-queue-type: quorum
    x-delivery-limit: 5
kafka:
  brokers: [a:9092, b:9092]
  consumer_group: billing
  session_timeout: 6s
  rebalance_timeout: 20s
  sasl:
    mechanism: PLAIN
    user: billing
    password: pw
  tls:
    enabled: true
gochannel:
  name: tests
options:
  region: eu
`))
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	require.Equal(t, "kafka", c.Kind)
	require.Equal(t, 16, c.AMQP.Concurrency)
	require.Equal(t, 250*time.Millisecond, c.AMQP.NackDelay)
	require.Equal(t, map[string]any{"x-queue-type": "quorum", "x-delivery-limit": 5}, c.AMQP.QueueArguments)
	require.Equal(t, 1, c.AMQP.Prefetch, "unset keys keep their defaults")
	require.Equal(t, []string{"a:9092", "b:9092"}, c.Kafka.Brokers)
	require.Equal(t, 6*time.Second, c.Kafka.SessionTimeout)
	require.Equal(t, 20*time.Second, c.Kafka.RebalanceTimeout)
	require.Equal(t, "PLAIN", c.Kafka.SASL.Mechanism)
	require.Equal(t, "tests", c.GoChannel.Name)
	require.Equal(t, map[string]string{"region": "eu"}, c.Options)

	c, err = brokers.ParseConfig(nil)
	require.NoError(t, err)
	require.Equal(t, brokers.DefaultConfig().String(), c.String(), "an empty file is the defaults")

	_, err = brokers.ParseConfig([]byte("kafka:\n  consumer_grup: typo\n"))
	require.ErrorContains(t, err, "consumer_grup", "unknown keys are rejected")
	_, err = brokers.ParseConfig([]byte("amqp:\n  nack_delay: soon\n"))
	require.Error(t, err)
}

func TestLoadConfigFileErrors(t *testing.T) {
	t.Parallel()
	_, err := brokers.LoadConfig(filepath.Join(t.TempDir(), "missing.yaml"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestValidate(t *testing.T) {
	t.Parallel()
	good := []brokers.Config{
		{},
		{Kind: "gochannel"},
		{Kind: "kafka"},
		{Kind: "amqp", AMQP: brokers.AMQPConfig{URL: "amqps://u:p@host:5671/vhost", Concurrency: 64, NackDelay: -1, DialTimeout: -1}},
		{Kind: "kafka", Kafka: brokers.KafkaConfig{SessionTimeout: time.Second, InitialOffset: "newest", Version: "2.8.1"}},
		{Kind: "kafka", Kafka: brokers.KafkaConfig{SASL: brokers.KafkaSASLConfig{Mechanism: "PLAIN", User: "u"}}},
		// An unused adapter's settings are not looked at.
		{Kind: "amqp", Kafka: brokers.KafkaConfig{InitialOffset: "sideways"}},
	}
	for i, c := range good {
		require.NoError(t, c.Validate(), "good[%d] %s", i, c)
	}

	bad := []struct {
		cfg    brokers.Config
		field  string
		reason string
	}{
		{brokers.Config{Kind: "NATS"}, "kind", "not a broker kind"},
		{brokers.Config{AMQP: brokers.AMQPConfig{URL: "http://host/"}}, "amqp.url", "scheme"},
		{brokers.Config{AMQP: brokers.AMQPConfig{URL: "amqp://u:p@host:notaport/"}}, "amqp.url", "not a valid URL"},
		{brokers.Config{AMQP: brokers.AMQPConfig{Concurrency: -1}}, "amqp.concurrency", "positive"},
		{brokers.Config{AMQP: brokers.AMQPConfig{Concurrency: 5000}}, "amqp.concurrency", "at most"},
		{brokers.Config{AMQP: brokers.AMQPConfig{Prefetch: -2}}, "amqp.prefetch", "positive"},
		{brokers.Config{AMQP: brokers.AMQPConfig{Window: 70000}}, "amqp.window", "65535"},
		{brokers.Config{Kind: "kafka", Kafka: brokers.KafkaConfig{Window: -1}}, "kafka.window", "negative"},
		{brokers.Config{AMQP: brokers.AMQPConfig{ReconnectInitialInterval: time.Minute, ReconnectMaxInterval: time.Second}}, "amqp.reconnect_max_interval", "at least"},
		{brokers.Config{AMQP: brokers.AMQPConfig{QueueArguments: map[string]any{"x": struct{}{}}}}, "amqp.queue_arguments", "AMQP table"},
		{brokers.Config{Kind: "kafka", Kafka: brokers.KafkaConfig{Brokers: []string{"nohost"}}}, "kafka.brokers", "host:port"},
		{brokers.Config{Kind: "kafka", Kafka: brokers.KafkaConfig{Brokers: []string{":9092"}}}, "kafka.brokers", "host:port"},
		{brokers.Config{Kind: "kafka", Kafka: brokers.KafkaConfig{InitialOffset: "latest"}}, "kafka.initial_offset", "oldest"},
		{brokers.Config{Kind: "kafka", Kafka: brokers.KafkaConfig{Version: "three"}}, "kafka.version", "Kafka version"},
		{brokers.Config{Kind: "kafka", Kafka: brokers.KafkaConfig{SessionTimeout: time.Second, HeartbeatInterval: 2 * time.Second}}, "kafka.heartbeat_interval", "below session_timeout"},
		{brokers.Config{Kind: "kafka", Kafka: brokers.KafkaConfig{MaxWaitTime: time.Microsecond}}, "kafka.max_wait_time", "1ms"},
		{brokers.Config{Kind: "kafka", Kafka: brokers.KafkaConfig{SASL: brokers.KafkaSASLConfig{Mechanism: "GSSAPI", User: "u"}}}, "kafka.sasl.mechanism", "PLAIN"},
		{brokers.Config{Kind: "kafka", Kafka: brokers.KafkaConfig{SASL: brokers.KafkaSASLConfig{Mechanism: "PLAIN"}}}, "kafka.sasl.user", "empty"},
		{brokers.Config{Kind: "kafka", Kafka: brokers.KafkaConfig{SASL: brokers.KafkaSASLConfig{Password: "x"}}}, "kafka.sasl.mechanism", "must be set"},
		{brokers.Config{Kind: "kafka", Kafka: brokers.KafkaConfig{TLS: brokers.KafkaTLSConfig{CAFile: "ca.pem"}}}, "kafka.tls.enabled", "must be true"},
		{brokers.Config{Kind: "kafka", Kafka: brokers.KafkaConfig{TLS: brokers.KafkaTLSConfig{Enabled: true, CertFile: "c.pem"}}}, "kafka.tls.key_file", "together"},
		{brokers.Config{Kind: "kafka", Kafka: brokers.KafkaConfig{TLS: brokers.KafkaTLSConfig{Enabled: true, KeyFile: "k.pem"}}}, "kafka.tls.cert_file", "together"},
		{brokers.Config{Kind: "gochannel", GoChannel: brokers.GoChannelConfig{Buffer: -1}}, "gochannel.buffer", "negative"},
	}
	for _, tc := range bad {
		err := tc.cfg.Validate()
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, "%s", tc.cfg)
		require.Equal(t, tc.field, ce.Field, "%v", err)
		require.Contains(t, ce.Reason, tc.reason)
		require.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf("claimtx: config field %q: ", tc.field)), err.Error())

		// The constructors refuse it with the same error, without panicking.
		_, err = brokers.NewSubscriber(tc.cfg, nil)
		require.ErrorAs(t, err, &ce)
		_, err = brokers.NewPublisher(tc.cfg, nil)
		require.ErrorAs(t, err, &ce)
	}

	// A kind that is not linked is refused by Validate and the
	// constructors alike.
	unknown := brokers.Config{Kind: "jetstream"}
	for _, build := range []func() error{
		unknown.Validate,
		func() error { _, err := brokers.NewSubscriber(unknown, nil); return err },
		func() error { _, err := brokers.NewPublisher(unknown, nil); return err },
	} {
		err := build()
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "kind", ce.Field)
		require.Contains(t, ce.Reason, `unknown broker kind "jetstream"`)
		require.ErrorIs(t, err, brokers.ErrInvalidKind)
	}
}

// TestConfigErrorMessage pins the format callers and docs quote.
func TestConfigErrorMessage(t *testing.T) {
	t.Parallel()
	err := brokers.Config{Kind: "kafka", Kafka: brokers.KafkaConfig{Brokers: []string{"x"}}}.Validate()
	require.EqualError(t, err, `claimtx: config field "kafka.brokers": entry 0 ("x") is not host:port`)
	var target *framework.ConfigError
	require.True(t, errors.As(err, &target))
}

// TestRedaction: passwords never show in String, %v, %+v, %#v or errors.
func TestRedaction(t *testing.T) {
	t.Parallel()
	const amqpPW, saslPW = "amqp-S3cret", "sasl-S3cret"
	c := brokers.DefaultConfig()
	c.AMQP.URL = "amqp://app:" + amqpPW + "@rabbit:5672/?auth_password=" + amqpPW
	c.Kafka.SASL = brokers.KafkaSASLConfig{Mechanism: "PLAIN", User: "app", Password: saslPW}

	for _, s := range []string{
		c.String(), fmt.Sprint(c), fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), fmt.Sprintf("%q", c),
		fmt.Sprint(c.AMQP), fmt.Sprintf("%#v", c.AMQP), fmt.Sprint(c.Kafka), fmt.Sprintf("%#v", c.Kafka),
		fmt.Sprintf("%+v", c.Kafka.SASL), fmt.Sprintf("%#v", c.Kafka.SASL), fmt.Sprintf("%v", &c),
	} {
		require.NotContains(t, s, amqpPW)
		require.NotContains(t, s, saslPW)
	}
	require.Contains(t, c.String(), "amqp://app:xxxxx@rabbit:5672/")
	require.Contains(t, c.String(), `Password:"xxxxx"`)

	// Validation errors about the URL do not quote the password either,
	// even when the URL does not parse (url.Error would print it whole).
	for _, u := range []string{
		"amqp://app:" + amqpPW + "@rabbit:port/",
		"amqp://app:" + amqpPW + "@ra bbit/",
		"http://app:" + amqpPW + "@rabbit/",
		"amqp://app:" + amqpPW + "@rabbit:5672/?heartbeat=x",
	} {
		err := brokers.Config{AMQP: brokers.AMQPConfig{URL: u}}.Validate()
		require.Error(t, err, u)
		require.NotContains(t, err.Error(), amqpPW)
	}
	fromEnv, err := brokers.DefaultConfig().OverlayEnv(mapEnv(map[string]string{"AMQP_URL": "amqp://app:" + amqpPW + "@rabbit:x/"}))
	require.NoError(t, err)
	err = fromEnv.Validate()
	require.Error(t, err)
	require.NotContains(t, err.Error(), amqpPW)
}

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
