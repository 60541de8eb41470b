package brokers_test

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
)

// secretMarker stands for a password. The fuzz targets put it where
// passwords go (the AMQP URL's userinfo, the SASL password) and check that
// it never comes out of String, %v, %#v or an error.
const secretMarker = "Zq9SecretMarkerPw"

// withPassword returns rawURL with secretMarker as its password: set in
// the userinfo when rawURL parses, else written in front of it (so an
// unparsable URL carries the secret too).
func withPassword(rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil && u.Host != "" {
		name := "app"
		if u.User != nil && u.User.Username() != "" {
			name = u.User.Username()
		}
		u.User = url.UserPassword(name, secretMarker)
		return u.String()
	}
	return "amqp://app:" + secretMarker + "@" + strings.TrimPrefix(rawURL, "amqp://")
}

// checkNoSecret fails if any printed form of c, or err, shows the marker.
func checkNoSecret(t *testing.T, c brokers.Config, errs ...error) {
	t.Helper()
	for _, s := range []string{c.String(), fmt.Sprint(c), fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c),
		c.AMQP.String(), c.Kafka.String(), fmt.Sprintf("%#v", c.Kafka.SASL)} {
		if strings.Contains(s, secretMarker) {
			t.Fatalf("password printed: %s", s)
		}
	}
	for _, err := range errs {
		if err != nil && strings.Contains(err.Error(), secretMarker) {
			t.Fatalf("password in error: %v", err)
		}
	}
}

// checkConfigError: every validation failure names a field.
func checkConfigError(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	var ce *framework.ConfigError
	if !errors.As(err, &ce) || ce.Field == "" {
		t.Fatalf("not a *framework.ConfigError with a field: %T %v", err, err)
	}
}

// saramaSafe: building a Kafka subscriber builds the Sarama configuration
// and never dials, but it reads the TLS files, and a fuzzed path such as
// /dev/zero would never end.
func saramaSafe(c brokers.Config, verr error) bool {
	t := c.Kafka.TLS
	return c.Kind == brokers.KindKafka && verr == nil && t.CAFile == "" && t.CertFile == "" && t.KeyFile == ""
}

// buildKafkaSubscriber builds (and closes) the subscriber of c, which maps
// c onto Sarama's configuration and has Sarama validate it, and returns
// the error.
func buildKafkaSubscriber(c brokers.Config) error {
	sub, err := brokers.NewSubscriber(c, nil)
	if err == nil {
		err = sub.Close()
	}
	return err
}

// FuzzParseConfig decodes arbitrary YAML. Properties: no panic in
// ParseConfig, Validate, String, or building the Sarama configuration;
// Validate fails only with a *framework.ConfigError naming a field; and with
// passwords set in the parsed config, nothing printed or returned shows
// them.
func FuzzParseConfig(f *testing.F) {
	for _, seed := range []string{
		"",
		"kind: kafka\n",
		"kind: amqp\namqp:\n  url: amqps://app:pw@rabbit:5671/vh?cacertfile=/ca.pem\n  concurrency: 16\n  nack_delay: 250ms\n",
		"amqp:\n  queue_arguments:\n    x-queue-type: quorum\n    x-delivery-limit: 5\n    nested: {a: [1, 2.5, true, null]}\n",
		"kafka:\n  brokers: [a:9092, 'b:9093']\n  sasl: {mechanism: SCRAM-SHA-512, user: u, password: pw}\n  tls: {enabled: true, ca_file: /nonexistent.pem}\n",
		"kafka:\n  session_timeout: 1ms\n  heartbeat_interval: 2ms\n  version: 0.8.2\n",
		"kafka:\n  consumer_grup: typo\n",
		"gochannel: {name: x, buffer: -1, persistent: true}\noptions: {region: eu}\n",
		"amqp: {url: 'amqp://u:p@h:notaport/'}\n",
		"kind: [1, 2]\n",
		"&a [*a]\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := brokers.ParseConfig(data)
		if err != nil {
			// A refused value names its YAML path; a syntax error has none.
			var ce *framework.ConfigError
			if errors.As(err, &ce) && ce.Field == "" {
				t.Fatalf("YAML error with an empty field: %v", err)
			}
			return
		}
		verr := c.Validate()
		checkConfigError(t, verr)
		if saramaSafe(c, verr) {
			checkConfigError(t, buildKafkaSubscriber(c))
		}

		c.AMQP.URL = withPassword(c.AMQP.URL)
		c.Kafka.SASL.Password = secretMarker
		if c.Kafka.SASL.Mechanism == "" {
			c.Kafka.SASL.Mechanism = "PLAIN"
		}
		if c.Kafka.SASL.User == "" {
			c.Kafka.SASL.User = "app"
		}
		if strings.Contains(string(data), secretMarker) {
			// The input itself holds the marker elsewhere: not a leak.
			return
		}
		verr = c.Validate()
		checkConfigError(t, verr)
		var serr error
		if saramaSafe(c, verr) {
			serr = buildKafkaSubscriber(c)
		}
		checkNoSecret(t, c, verr, serr, c.AMQP.Validate(), c.Kafka.Validate())
	})
}

// FuzzOverlayEnv applies arbitrary environment values. Properties: no
// panic; a bad value is a *framework.ConfigError whose Field is the variable;
// the AMQP URL's password and the SASL password never show in the config's
// printed forms or in any error.
func FuzzOverlayEnv(f *testing.F) {
	type vars struct {
		broker, amqpURL, concurrency, nackDelay, kafkaBrokers, session, tls, mech, user string
	}
	for _, v := range []vars{
		{},
		{"kafka", "amqp://guest:guest@127.0.0.1:5672/", "4", "1s", "127.0.0.1:9092", "3s", "false", "", ""},
		{"amqp", "amqps://rabbit:5671/vh?cacertfile=/ca.pem&server_name_indication=rabbit", "64", "-1s", "", "", "", "", ""},
		{"kafka", "", "0", "soon", " , ", "10", "yes please", "SCRAM-SHA-256", "svc"},
		{"nats", "http://host/", "-1", "1h", "k1:9092,k2:9093", "1ms", "true", "GSSAPI", ""},
		{"kafka", "amqp://u:p@h:notaport/", "2", "", "nohost", "100ms", "1", "PLAIN", "user with spaces"},
		{"amqp", "amqp://u:p@ra bbit/?heartbeat=x", "5000", "", "", "", "", "", ""},
	} {
		f.Add(v.broker, v.amqpURL, v.concurrency, v.nackDelay, v.kafkaBrokers, v.session, v.tls, v.mech, v.user)
	}
	f.Fuzz(func(t *testing.T, broker, amqpURL, concurrency, nackDelay, kafkaBrokers, session, tls, mech, user string) {
		all := strings.Join([]string{broker, amqpURL, concurrency, nackDelay, kafkaBrokers, session, tls, mech, user}, "\x00")
		if strings.Contains(all, secretMarker) {
			return
		}
		env := map[string]string{
			"BROKER": broker, "AMQP_URL": withPassword(amqpURL), "CONCURRENCY": concurrency,
			"AMQP_NACK_DELAY": nackDelay, "KAFKA_BROKERS": kafkaBrokers,
			"KAFKA_SESSION_TIMEOUT": session, "KAFKA_TLS": tls,
			"KAFKA_SASL_MECHANISM": mech, "KAFKA_SASL_USER": user,
			"KAFKA_SASL_PASSWORD": secretMarker,
		}
		c, err := brokers.DefaultConfig().OverlayEnv(mapEnv(env))
		if err != nil {
			checkConfigError(t, err)
			var ce *framework.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("not a *framework.ConfigError: %v", err)
			}
			if _, set := env[ce.Field]; !set || !strings.Contains(err.Error(), fmt.Sprintf("config field %q", ce.Field)) {
				t.Fatalf("the error does not name the variable: %v", err)
			}
			checkNoSecret(t, brokers.Config{}, err)
			return
		}
		verr := c.Validate()
		checkConfigError(t, verr)
		checkNoSecret(t, c, verr, c.AMQP.Validate(), c.Kafka.Validate())
		// Validation is a pure function of the config.
		if again := c.Validate(); (again == nil) != (verr == nil) || (again != nil && again.Error() != verr.Error()) {
			t.Fatalf("Validate not deterministic: %v vs %v", verr, again)
		}
	})
}
