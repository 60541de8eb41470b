package consumer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/config"
	"github.com/claimtx/claimtx/middleware"
)

// The tests of LoadConfig set environment variables (t.Setenv), so none
// of them runs in parallel.

// examplePath is the documented example configuration.
const examplePath = "../../examples/loyalty/config.example.yaml"

// brokerEnv is every variable package brokers reads.
var brokerEnv = []string{
	"BROKER", "AMQP_URL", "AMQP_URL_FILE", "CONCURRENCY", "AMQP_PREFETCH", "AMQP_WINDOW",
	"AMQP_NACK_DELAY", "AMQP_DIAL_TIMEOUT", "AMQP_QUEUE_TYPE", "AMQP_DELIVERY_LIMIT",
	"KAFKA_BROKERS", "KAFKA_CONSUMER_GROUP", "KAFKA_INITIAL_OFFSET", "KAFKA_VERSION",
	"KAFKA_CLIENT_ID", "KAFKA_SESSION_TIMEOUT", "KAFKA_REBALANCE_TIMEOUT", "KAFKA_NACK_DELAY",
	"KAFKA_WINDOW", "KAFKA_DIAL_TIMEOUT", "KAFKA_SASL_MECHANISM", "KAFKA_SASL_USER",
	"KAFKA_SASL_PASSWORD", "KAFKA_SASL_PASSWORD_FILE", "KAFKA_TLS", "KAFKA_TLS_CA_FILE",
	"KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE",
}

// clearEnv unsets (sets empty, which counts as unset) every variable
// LoadConfig reads, so the runner's environment cannot leak into a case.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, s := range settings {
		t.Setenv(s.Env, "")
		t.Setenv(s.Env+"_FILE", "")
	}
	for _, name := range brokerEnv {
		t.Setenv(name, "")
	}
}

// writeFile writes content to a file of its own and returns its path.
func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "consumer.yaml")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// loadCase runs LoadConfig on yaml (no file when empty) with only the
// environment env ("NAME=value" each) set of what LoadConfig reads.
func loadCase(t *testing.T, yaml string, env []string) (Config, error) {
	t.Helper()
	clearEnv(t)
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		t.Setenv(name, value)
	}
	path := ""
	if yaml != "" {
		path = writeFile(t, yaml)
	}
	return LoadConfig(path)
}

// requireField requires err to be a *framework.ConfigError naming field
// and returns it; msgAndArgs say which case failed.
func requireField(t *testing.T, err error, field string, msgAndArgs ...any) *framework.ConfigError {
	t.Helper()
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce, msgAndArgs...)
	require.Equal(t, field, ce.Field, msgAndArgs...)
	return ce
}

// nested turns "claim.key_policy.max_bytes: 7" into nested YAML.
func nested(path, value string) string {
	parts := strings.Split(path, ".")
	var b strings.Builder
	for i, p := range parts {
		b.WriteString(strings.Repeat("  ", i) + p + ":")
		if i == len(parts)-1 {
			b.WriteString(" " + value)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// TestLoadConfigExample loads examples/loyalty/config.example.yaml: it is
// valid, and what it writes out are the defaults.
func TestLoadConfigExample(t *testing.T) {
	clearEnv(t)
	c, err := LoadConfig(examplePath)
	require.NoError(t, err)
	require.Equal(t, "loyalty", c.Name)
	require.Equal(t, "order-completed", c.Topic)
	require.Equal(t, "template:order-completed:{payload.order_id}", c.Key)
	require.Equal(t, "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", c.DatabaseURL)
	require.Equal(t, "claimtx", c.Store.Schema)
	require.Equal(t, middleware.ModeClaimTable, c.Claim.Mode)
	require.Equal(t, pgx.ReadCommitted, c.Claim.Isolation)
	require.Equal(t, 5*time.Second, c.Claim.MaxClaimWait)
	require.Equal(t, 5, c.Claim.MaxAttempts)
	require.Equal(t, 512, c.Claim.KeyPolicy.MaxBytes)
	require.Equal(t, 3, c.HandlerRetries)
	require.Equal(t, 15*time.Second, c.DrainTimeout)
	require.Equal(t, 30*time.Second, c.StartupTimeout)
	require.Equal(t, brokers.KindAMQP, c.Broker.Kind)
	require.Equal(t, "classic", c.Broker.AMQP.QueueType)
	def, err := config.LoadSection[brokers.Config](nil)
	require.NoError(t, err)
	require.Equal(t, def.String(), c.Broker.String(), "the example's broker section is the defaults")
}

// TestExampleDocumentsEveryKey: the example holds every key LoadConfig
// accepts, the broker's included (so a new setting cannot go
// undocumented), nothing else, and a comment on each.
func TestExampleDocumentsEveryKey(t *testing.T) {
	data, err := os.ReadFile(examplePath)
	require.NoError(t, err)
	var doc yaml.Node
	require.NoError(t, yaml.Unmarshal(data, &doc))
	documented := map[string]bool{}
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			path := prefix + k.Value
			require.NotEmpty(t, strings.TrimSpace(k.HeadComment+k.LineComment+v.LineComment), "%s has no comment", path)
			if v.Kind == yaml.MappingNode && (isSection(path) || path == brokerKey || strings.HasPrefix(path, brokerKey+".") && len(v.Content) > 0 && path != brokerKey+".options") {
				walk(v, path+".")
				continue
			}
			documented[path] = true
		}
	}
	walk(doc.Content[0], "")

	want := map[string]bool{}
	for _, s := range settings {
		want[s.Path] = true
	}
	for _, p := range yamlPaths(reflect.TypeFor[brokers.Config](), brokerKey+".") {
		want[p] = true
	}
	require.Equal(t, sortedKeys(want), sortedKeys(documented))
}

// yamlPaths lists the YAML paths of t's fields, nested structs expanded.
func yamlPaths(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if !f.IsExported() || tag == "" || tag == "-" {
			continue
		}
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Duration]() {
			out = append(out, yamlPaths(f.Type, prefix+tag+".")...)
			continue
		}
		out = append(out, prefix+tag)
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// settingValues are a valid value, other than the default, for every
// setting: each must reach the Config, from the file and from its
// variable alike.
var settingValues = map[string]string{
	"name": "billing", "topic": "orders", "poison_topic": "orders.dead", "key": "metadata:event_id",
	"event_time": "json:occurred_at", "retention": "720h", "database_url": "postgres://app@db:5433/app",
	"store.schema": "claims", "store.claims_table": "claims", "store.outbox_table": "out",
	"claim.mode": "natural_key", "claim.isolation": "serializable", "claim.max_claim_wait": "2s", "claim.synchronous_commit": "remote_apply",
	"claim.max_group": "4", "claim.max_group_time": "20ms", "claim.max_attempts": "9", "claim.initial_backoff": "20ms", "claim.max_backoff": "3s",
	"claim.allow_broker_event_time": "true", "claim.fingerprint": "true", "claim.poison_memo": "true", "claim.no_positions": "true", "claim.replay_below_positions": "true", "claim.outbox_topic": "events",
	"claim.order_key": "template:{payload.account_id}", "claim.park_retry": "30s", "claim.parked_warn_age": "2h",
	"claim.committed_keys": "-1", "claim.committed_keys_ttl": "5m",
	"claim.key_policy.max_bytes": "64", "claim.key_policy.hash_overlong": "true",
	"handler.retries": "7", "handler.retry_initial_interval": "1s", "handler.timeout": "30s",
	"drain_timeout": "20s", "startup_timeout": "-1s",
}

// TestLoadConfigEveryKey: every key is accepted, changes its field, and
// its variable sets the same value and wins over the file.
func TestLoadConfigEveryKey(t *testing.T) {
	clearEnv(t)
	base, err := LoadConfig(writeFile(t, "{}\n"))
	require.NoError(t, err)
	for _, s := range settings {
		v, ok := settingValues[s.Path]
		require.True(t, ok, "settingValues lacks %s", s.Path)
		t.Run(s.Path, func(t *testing.T) {
			fromFile, err := LoadConfig(writeFile(t, nested(s.Path, v)))
			require.NoError(t, err)
			require.NotEqual(t, base.String(), fromFile.String(), "%s changed nothing", s.Path)
			require.Equal(t, s.Path, fromFile.names[s.Field])

			t.Setenv(s.Env, v)
			fromEnv, err := LoadConfig("")
			require.NoError(t, err)
			require.Equal(t, fromFile.String(), fromEnv.String(), "%s and %s set the same", s.Path, s.Env)
			require.Equal(t, s.Env, fromEnv.names[s.Field])

			// The variable wins over the file, whatever the file says.
			both, err := LoadConfig(writeFile(t, "{}\n"))
			require.NoError(t, err)
			require.Equal(t, fromEnv.String(), both.String())
		})
	}
}

// TestLoadConfigPrecedence: defaults, then the file, then the environment.
func TestLoadConfigPrecedence(t *testing.T) {
	clearEnv(t)
	path := writeFile(t, "topic: from-file\nhandler:\n  retries: 5\nbroker:\n  amqp:\n    queue_type: quorum\n    concurrency: 2\n")
	c, err := LoadConfig(path)
	require.NoError(t, err)
	require.Equal(t, "from-file", c.Topic)
	require.Equal(t, 5, c.HandlerRetries)
	require.Equal(t, "quorum", c.Broker.AMQP.QueueType)
	require.Equal(t, 2, c.Broker.AMQP.Concurrency)
	require.Zero(t, c.DrainTimeout, "an unset key keeps the zero value: New's default")

	t.Setenv("TOPIC", "from-env")
	t.Setenv("CONCURRENCY", "6")
	t.Setenv("AMQP_DELIVERY_LIMIT", "40")
	c, err = LoadConfig(path)
	require.NoError(t, err)
	require.Equal(t, "from-env", c.Topic)
	require.Equal(t, 5, c.HandlerRetries)
	require.Equal(t, 6, c.Broker.AMQP.Concurrency)
	require.Equal(t, 40, c.Broker.AMQP.DeliveryLimit)
}

// TestLoadConfigErrorsNameWhatWasWritten: unknown keys and bad values
// are *framework.ConfigErrors naming the YAML path (with the line) or the
// variable.
func TestLoadConfigErrorsNameWhatWasWritten(t *testing.T) {
	for _, tc := range []struct {
		yaml  string
		env   []string
		field string
		want  string
	}{
		{yaml: "topc: orders\n", field: "topc", want: "unknown key (line 1)"},
		{yaml: "topic: orders\nclaim:\n  max_claim_wai: 5s\n", field: "claim.max_claim_wai", want: "unknown key (line 3)"},
		{yaml: "claim:\n  key_policy:\n    max_byte: 5\n", field: "claim.key_policy.max_byte", want: "line 3"},
		{yaml: "broker:\n  amqp:\n    queue_typ: quorum\n", field: "broker.amqp.queue_typ", want: "line 3"},
		{yaml: "broker:\n  kindd: kafka\n", field: "broker.kindd", want: "line 2"},
		{yaml: "max_claim_wait: 5s\n", field: "max_claim_wait", want: "unknown key"},
		{yaml: "claim:\n  max_claim_wait: soon\n", field: "claim.max_claim_wait", want: `got "soon" (line 2)`},
		{yaml: "claim:\n  isolation: chaos\n", field: "claim.isolation", want: "serializable"},
		{yaml: "claim:\n  mode: table\n", field: "claim.mode", want: "natural_key"},
		{yaml: "claim:\n  synchronous_commit: \"off\"\n", field: "claim.synchronous_commit", want: "refused"},
		{yaml: "claim:\n  synchronous_commit: off\n", field: "claim.synchronous_commit", want: "refused"},
		{yaml: "claim:\n  synchronous_commit: remote\n", field: "claim.synchronous_commit", want: "remote_apply"},
		{env: []string{"CLAIM_SYNCHRONOUS_COMMIT=off"}, field: "CLAIM_SYNCHRONOUS_COMMIT", want: "a database crash could lose an effect"},
		{yaml: "claim:\n  max_attempts: 0\n", field: "claim.max_attempts", want: "at least 1"},
		{yaml: "claim: 5\n", field: "claim", want: "mapping"},
		{yaml: "topic: [a, b]\n", field: "topic", want: "single value"},
		{yaml: "topic: a\ntopic: b\n", field: "topic", want: "set twice (line 2)"},
		{yaml: "handler:\n  retries: -1\n", field: "handler.retries", want: "at least 0"},
		{yaml: "drain_timeout: 0s\n", field: "drain_timeout", want: "positive"},
		{yaml: "startup_timeout: 0s\n", field: "startup_timeout", want: "not 0"},
		{yaml: "retention: -1h\n", field: "retention", want: "negative"},
		{yaml: "claim:\n  fingerprint: yes\n", field: "claim.fingerprint", want: "true or false"},
		{yaml: "store:\n  schema: Not-A-Schema\n", field: "store.schema"},
		{yaml: "database_url: \"postgres://u:pw@db:port/x\"\n", field: "database_url", want: "invalid port"},
		{yaml: "broker:\n  amqp:\n    concurrency: 5000\n", field: "broker.amqp.concurrency", want: "at most"},
		{yaml: "broker:\n  amqp:\n    delivery_limit: 3\n", field: "broker.amqp.delivery_limit", want: "quorum"},
		{yaml: "broker:\n  amqp:\n    nack_delay: soon\n", field: "broker.amqp.nack_delay", want: "line 3"},
		{yaml: "broker:\n  kind: Kafka\n", field: "broker.kind", want: "not a broker kind"},
		{env: []string{"CLAIM_MAX_CLAIM_WAIT=soon"}, field: "CLAIM_MAX_CLAIM_WAIT", want: `got "soon"`},
		{yaml: "claim:\n  max_claim_wait: 1s\n", env: []string{"CLAIM_MAX_CLAIM_WAIT=-1s"}, field: "CLAIM_MAX_CLAIM_WAIT", want: "positive"},
		{env: []string{"HANDLER_RETRIES=many"}, field: "HANDLER_RETRIES"},
		{env: []string{"CLAIMTX_SCHEMA=Not-A-Schema"}, field: "CLAIMTX_SCHEMA"},
		{yaml: "store:\n  schema: ok_schema\n", env: []string{"CLAIMTX_SCHEMA=Not-A-Schema"}, field: "CLAIMTX_SCHEMA"},
		{yaml: "broker:\n  amqp:\n    queue_type: classic\n", env: []string{"AMQP_DELIVERY_LIMIT=3"}, field: "AMQP_DELIVERY_LIMIT", want: "quorum"},
		{env: []string{"AMQP_QUEUE_TYPE=lazy"}, field: "AMQP_QUEUE_TYPE"},
	} {
		t.Run(tc.field, func(t *testing.T) {
			_, err := loadCase(t, tc.yaml, tc.env)
			requireField(t, err, tc.field, "%q %v: %v", tc.yaml, tc.env, err)
			require.Contains(t, err.Error(), tc.want)
			require.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf("claimtx: config field %q: ", tc.field)), err.Error())
		})
	}

	clearEnv(t)
	_, err := LoadConfig(writeFile(t, "topic: [\n"))
	require.ErrorContains(t, err, "parse YAML")
	_, err = LoadConfig(filepath.Join(t.TempDir(), "missing.yaml"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestNewNamesLoadedFields: what New refuses about a field LoadConfig set
// is named as the user wrote it, path or variable; a Config built in code
// keeps the Go names. Every case fails before anything connects.
func TestNewNamesLoadedFields(t *testing.T) {
	noop := func(context.Context, pgx.Tx, *message.Message) error { return nil }
	const unreachable = "database_url: \"postgres://postgres@127.0.0.1:1/none?connect_timeout=1\"\n"
	for _, tc := range []struct {
		yaml  string
		env   []string
		field string
	}{
		{yaml: unreachable + "name: loyalty\ntopic: t\nkey: \"jsn:order_id\"\n", field: "key"},
		{yaml: unreachable + "name: loyalty\ntopic: t\nkey: \"json:id\"\n", env: []string{"KEY=jsn:order_id"}, field: "KEY"},
		{yaml: unreachable + "name: loyalty\ntopic: t\nkey: \"json:id\"\nevent_time: \"wall:clock\"\n", field: "event_time"},
		{yaml: unreachable + "name: \"" + strings.Repeat("n", 201) + "\"\ntopic: t\nkey: \"json:id\"\n", field: "name"},
		{yaml: unreachable + "name: loyalty\nkey: \"json:id\"\n", field: "topic"},
		{yaml: unreachable + "name: loyalty\ntopic: t\n", field: "key"},
		{yaml: unreachable + "name: loyalty\ntopic: t\nkey: \"json:id\"\nretention: 1h\n", field: "event_time"},
		{env: []string{"DATABASE_URL=postgres://postgres@127.0.0.1:1/none", "CONSUMER_NAME=loyalty", "TOPIC=t"}, field: "KEY"},
	} {
		t.Run(tc.field, func(t *testing.T) {
			c, err := loadCase(t, tc.yaml, tc.env)
			require.NoError(t, err)
			c.StartupTimeout = -1
			_, err = New(t.Context(), c, noop)
			requireField(t, err, tc.field, "%v", err)
		})
	}
	_, err := New(t.Context(), Config{Name: "loyalty", Topic: "t", Key: "jsn:x", DatabaseURL: "postgres://x/y"}, noop)
	requireField(t, err, "key", "a Config from code keeps the registry's name")
}

// secretMarker stands for a password.
const secretMarker = "Zq9SecretMarkerPw"

// TestLoadConfigSecrets: DATABASE_URL_FILE (and the broker's _FILE
// variables) read secrets from files; no password appears in String, %v,
// %+v, %#v or any error, whatever shape the connection string has.
func TestLoadConfigSecrets(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	t.Setenv("DATABASE_URL_FILE", write("db", "postgres://app:"+secretMarker+"@db:5432/app\n"))
	t.Setenv("AMQP_URL_FILE", write("amqp", "amqp://app:"+secretMarker+"@rabbit:5672/\n"))
	c, err := LoadConfig(writeFile(t, "topic: t\n"))
	require.NoError(t, err)
	require.Equal(t, "postgres://app:"+secretMarker+"@db:5432/app", c.DatabaseURL)
	require.Equal(t, "amqp://app:"+secretMarker+"@rabbit:5672/", c.Broker.AMQP.URL)
	require.Equal(t, "DATABASE_URL_FILE", c.names["DatabaseURL"])
	requireNoSecret(t, c)
	require.Contains(t, c.String(), `DatabaseURL:"postgres://app:xxxxx@db:5432/app"`)

	for _, dsn := range []string{
		"postgres://app:" + secretMarker + "@db:5432/app?password=" + secretMarker,
		"host=db user=app password=" + secretMarker + " dbname=app",
		"host=db user=app password='" + secretMarker + " x' dbname=app",
		"postgres://app:" + secretMarker + "@db:port/app",
		"postgres://app:" + secretMarker + "@[db/app",
		"host=db password='" + secretMarker + " unterminated",
		"postgres://app:" + secretMarker + "@db/app?connect_timeout=x",
	} {
		requireNoSecret(t, Config{DatabaseURL: dsn})
		clearEnv(t)
		t.Setenv("DATABASE_URL", dsn)
		_, err := LoadConfig("")
		if err != nil {
			require.NotContains(t, err.Error(), secretMarker)
			requireField(t, err, "DATABASE_URL")
		}
		_, err = LoadConfig(writeFile(t, fmt.Sprintf("database_url: %q\n", dsn)))
		if err != nil {
			require.NotContains(t, err.Error(), secretMarker)
		}
		_, err = New(t.Context(), Config{Name: "loyalty", Topic: "t", Key: "json:id", DatabaseURL: dsn, StartupTimeout: -1},
			func(context.Context, pgx.Tx, *message.Message) error { return nil })
		require.Error(t, err)
		require.NotContains(t, err.Error(), secretMarker)
	}

	clearEnv(t)
	t.Setenv("DATABASE_URL", "postgres://a/b")
	t.Setenv("DATABASE_URL_FILE", write("db2", "postgres://c/d"))
	_, err = LoadConfig("")
	ce := requireField(t, err, "DATABASE_URL_FILE")
	require.Contains(t, ce.Reason, "not both")
	clearEnv(t)
	t.Setenv("DATABASE_URL_FILE", write("empty", "\n"))
	_, err = LoadConfig("")
	require.ErrorAs(t, err, &ce)
	require.Contains(t, ce.Reason, "empty")
	t.Setenv("DATABASE_URL_FILE", filepath.Join(dir, "missing"))
	_, err = LoadConfig("")
	require.ErrorAs(t, err, &ce)
	require.Contains(t, ce.Reason, "cannot read")
}

func requireNoSecret(t *testing.T, c Config) {
	t.Helper()
	for _, s := range []string{c.String(), fmt.Sprint(c), fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), fmt.Sprintf("%v", &c)} {
		require.NotContains(t, s, secretMarker)
	}
}

// TestStringPrintsEffectiveValues: String prints what New will use, so a
// field left zero shows its default, not a zero (it once printed
// MaxClaimWait:0s MaxAttempts:0 DrainTimeout:0s), and a field set keeps
// its value.
func TestStringPrintsEffectiveValues(t *testing.T) {
	clearEnv(t)
	s := Config{Name: "loyalty", Topic: "orders"}.String()
	for _, want := range []string{
		`PoisonTopic:"orders.poison"`, "Store:{Schema:claimtx ClaimsTable:processed_messages OutboxTable:outbox}",
		`Mode:"claim_table"`, `Isolation:"read committed"`, "MaxClaimWait:5s", `SynchronousCommit:"(server default)"`, "MaxAttempts:5",
		"InitialBackoff:10ms", "MaxBackoff:1s", "CommittedKeys:100000", "CommittedKeysTTL:10m0s",
		"KeyPolicy:{MaxBytes:512 ", "HandlerRetries:3", "RetryInitialInterval:100ms", "DrainTimeout:15s",
		"StartupTimeout:30s", `Broker:{Kind:"amqp"`, `ConsumerGroup:"loyalty"`,
	} {
		require.Contains(t, s, want)
	}

	set := Config{Name: "loyalty", Topic: "orders", Retention: 10 * time.Minute, DrainTimeout: 2 * time.Second, StartupTimeout: -1,
		Claim: middleware.Claim{MaxClaimWait: 2 * time.Second, MaxAttempts: 9, SynchronousCommit: "remote_apply"}}.String()
	for _, want := range []string{
		"MaxClaimWait:2s", `SynchronousCommit:"remote_apply"`, "MaxAttempts:9", "DrainTimeout:2s", "StartupTimeout:-1ns",
		"CommittedKeysTTL:5m0s", // capped at half the retention, as New does
	} {
		require.Contains(t, set, want)
	}

	// LoadConfig fills the broker's defaults itself; the rest it leaves
	// zero for New. Printed, both are the same configuration.
	loaded, err := LoadConfig("")
	require.NoError(t, err)
	require.Equal(t, Config{}.String(), loaded.String())
}
