package consumer

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/committedkeys"
	"github.com/claimtx/claimtx/internal/config"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/middleware"
)

// LoadConfig reads the YAML file at path (none when ""), then the
// environment over it, and returns the Config they describe, checked. Its
// errors, and those of New about the fields it set, are
// *framework.ConfigError naming what the user wrote: the YAML path or the
// variable. See docs/configuration.md.
func LoadConfig(path string) (Config, error) {
	var data []byte
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil { //nolint:gosec // reading the file the caller names is the point
			return Config{}, fmt.Errorf("consumer: read config: %w", err)
		}
	}
	c, err := load(data, path != "")
	if err != nil && path != "" && !errors.As(err, new(*framework.ConfigError)) {
		return Config{}, fmt.Errorf("consumer: config file %s: %w", path, err)
	}
	return c, err
}

type setting = config.Setting[Config]

// settings are the keys of the file; one without a Set func is parsed by
// its field's type and Rule (config.Bind).
var settings = config.Bind([]setting{
	{Path: "name", Env: "CONSUMER_NAME", Field: "Name"},
	{Path: "topic", Env: "TOPIC", Field: "Topic"},
	{Path: "poison_topic", Env: "POISON_TOPIC", Field: "PoisonTopic"},
	{Path: "key", Env: "KEY", Field: "Key"},
	{Path: "event_time", Env: "EVENT_TIME", Field: "EventTime"},
	{Path: "retention", Env: "RETENTION", Field: "Retention", Rule: "min=0"},
	{Path: "database_url", Env: "DATABASE_URL", Field: "DatabaseURL", Secret: true, Set: func(c *Config, v string) error {
		if _, err := pgxpool.ParseConfig(v); err != nil {
			return config.SafeError{Msg: pgxReason(err, v), Err: err}
		}
		c.DatabaseURL = v
		return nil
	}},
	{Path: "store.schema", Env: "CLAIMTX_SCHEMA", Field: "Schema", Set: func(c *Config, v string) error { c.Store.Schema = v; return nil }},
	{Path: "store.claims_table", Env: "CLAIMTX_CLAIMS_TABLE", Field: "ClaimsTable", Set: func(c *Config, v string) error { c.Store.ClaimsTable = v; return nil }},
	{Path: "store.outbox_table", Env: "CLAIMTX_OUTBOX_TABLE", Field: "OutboxTable", Set: func(c *Config, v string) error { c.Store.OutboxTable = v; return nil }},
	{Path: "claim.mode", Env: "CLAIM_MODE", Field: "Claim.Mode", Set: func(c *Config, v string) error {
		switch m := middleware.ClaimMode(v); m {
		case middleware.ModeClaimTable, middleware.ModeNaturalKey:
			c.Claim.Mode = m
			return nil
		}
		return fmt.Errorf("must be %s or %s, got %q", middleware.ModeClaimTable, middleware.ModeNaturalKey, v)
	}},
	{Path: "claim.isolation", Env: "CLAIM_ISOLATION", Field: "Claim.Isolation", Set: func(c *Config, v string) error {
		levels := map[string]pgx.TxIsoLevel{"read_committed": pgx.ReadCommitted, "repeatable_read": pgx.RepeatableRead, "serializable": pgx.Serializable}
		l, ok := levels[strings.ToLower(v)]
		if !ok {
			return fmt.Errorf("must be read_committed, repeatable_read or serializable, got %q", v)
		}
		c.Claim.Isolation = l
		return nil
	}},
	{Path: "claim.max_claim_wait", Env: "CLAIM_MAX_CLAIM_WAIT", Field: "Claim.MaxClaimWait", Rule: "min=1"},
	// A failed Set fails the load: storing first is safe.
	{Path: "claim.synchronous_commit", Env: "CLAIM_SYNCHRONOUS_COMMIT", Field: "Claim.SynchronousCommit", Set: func(c *Config, v string) error {
		c.Claim.SynchronousCommit = v
		return pg.CheckSynchronousCommit(v)
	}},
	{Path: "claim.max_group", Env: "CLAIM_MAX_GROUP", Field: "Claim.MaxGroup", Rule: "min=1"},
	{Path: "claim.max_group_time", Env: "CLAIM_MAX_GROUP_TIME", Field: "Claim.MaxGroupTime", Rule: "min=1"},
	{Path: "claim.max_attempts", Env: "CLAIM_MAX_ATTEMPTS", Field: "Claim.MaxAttempts", Rule: "min=1"},
	{Path: "claim.initial_backoff", Env: "CLAIM_INITIAL_BACKOFF", Field: "Claim.InitialBackoff", Rule: "min=1"},
	{Path: "claim.max_backoff", Env: "CLAIM_MAX_BACKOFF", Field: "Claim.MaxBackoff", Rule: "min=1"},
	{Path: "claim.allow_broker_event_time", Env: "CLAIM_ALLOW_BROKER_EVENT_TIME", Field: "Claim.AllowBrokerEventTime"},
	{Path: "claim.fingerprint", Env: "CLAIM_FINGERPRINT", Field: "Claim.Fingerprint"},
	{Path: "claim.poison_memo", Env: "POISON_MEMO", Field: "Claim.PoisonMemo"},
	{Path: "claim.committed_keys", Env: "CLAIM_COMMITTED_KEYS", Field: "Claim.CommittedKeys", Rule: "min=-1"},
	{Path: "claim.committed_keys_ttl", Env: "CLAIM_COMMITTED_KEYS_TTL", Field: "Claim.CommittedKeysTTL", Rule: "min=1"},
	{Path: "claim.no_positions", Env: "CLAIM_NO_POSITIONS", Field: "Claim.NoPositions"},
	{Path: "claim.replay_below_positions", Env: "CLAIM_REPLAY_BELOW_POSITIONS", Field: "Claim.ReplayBelowPositions"},
	{Path: "claim.outbox_topic", Env: "CLAIM_OUTBOX_TOPIC", Field: "Claim.OutboxTopic"},
	{Path: "claim.order_key", Env: "ORDER_KEY", Field: "OrderKey"},
	{Path: "claim.park_retry", Env: "PARK_RETRY", Field: "ParkRetry", Rule: "min=0"},
	{Path: "claim.parked_warn_age", Env: "PARKED_WARN_AGE", Field: "ParkedWarnAge", Rule: "min=1"},
	{Path: "claim.key_policy.max_bytes", Env: "CLAIM_KEY_MAX_BYTES", Field: "Claim.KeyPolicy.MaxBytes", Rule: "min=1"},
	{Path: "claim.key_policy.hash_overlong", Env: "CLAIM_KEY_HASH_OVERLONG", Field: "Claim.KeyPolicy.HashOverlong"},
	{Path: "handler.retries", Env: "HANDLER_RETRIES", Field: "HandlerRetries", Rule: "min=0"},
	{Path: "handler.retry_initial_interval", Env: "HANDLER_RETRY_INITIAL_INTERVAL", Field: "RetryInitialInterval", Rule: "min=1"},
	{Path: "handler.timeout", Env: "HANDLER_TIMEOUT", Field: "HandlerTimeout", Rule: "min=0"},
	{Path: "drain_timeout", Env: "DRAIN_TIMEOUT", Field: "DrainTimeout", Rule: "min=1"},
	{Path: "startup_timeout", Env: "STARTUP_TIMEOUT", Field: "StartupTimeout", Set: func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d == 0 {
			return fmt.Errorf("must be a duration like 30s, not 0 (negative: one attempt), got %q", v)
		}
		c.StartupTimeout = d
		return nil
	}},
})

const brokerKey = "broker" // the section brokers.LoadConfig reads

// aliases are the other names errors use for a setting's field (the
// extractor registry's, the claim middleware's).
var aliases = map[string][]string{
	"Key":       {"key"},
	"EventTime": {"event_time", "Claim.EventTime"},
}

// load builds the Config from data (the file) and the environment.
func load(data []byte, fromFile bool) (Config, error) {
	c := Config{names: map[string]string{}}
	// name: errors about s's field say name.
	name := func(s setting, name string) {
		c.names[s.Field] = name
		for _, a := range aliases[s.Field] {
			c.names[a] = name
		}
	}
	byPath := make(map[string]setting, len(settings))
	for _, s := range settings {
		byPath[s.Path] = s
		// A field nobody set: the file's key, else the variable.
		if fromFile {
			name(s, s.Path)
		} else {
			name(s, s.Env)
		}
	}
	brokerSection, err := config.ReadFile(data, byPath, isSection, brokerKey, &c)
	if err != nil {
		return Config{}, err
	}
	if err := config.ApplyEnv(&c, settings, os.LookupEnv, name); err != nil {
		return Config{}, err
	}
	if c.Broker, err = readBroker(data, brokerSection, fromFile); err != nil {
		return Config{}, err
	}
	if c.ordered() {
		if c.Broker, err = unsetInFlight(c.Broker, brokerSection); err != nil {
			return Config{}, err
		}
	}
	// The store names, which code cannot complete later.
	if err := c.named(c.Store.Validate()); err != nil {
		return Config{}, err
	}
	return c, nil
}

// unsetInFlight clears the broker settings that put more than one message
// in flight and that the user did not set, so that an order key's default
// (one, Config.withDefaults) applies rather than the loader's: only an
// explicit larger value is refused (checkOrdered).
func unsetInFlight(b brokers.Config, section []byte) (brokers.Config, error) {
	var given map[string]any
	if err := config.Decode(section, &given); err != nil {
		return b, err
	}
	for _, s := range []struct {
		env, kind, key string
		field          *int
	}{
		{"CONCURRENCY", "amqp", "concurrency", &b.AMQP.Concurrency},
		{"NATS_CONCURRENCY", "nats", "concurrency", &b.NATS.Concurrency},
		{"NATS_MAX_ACK_PENDING", "nats", "max_ack_pending", &b.NATS.MaxAckPending},
	} {
		_, inEnv := os.LookupEnv(s.env)
		kind, _ := given[s.kind].(map[string]any)
		_, inFile := kind[s.key]
		if !inEnv && !inFile {
			*s.field = 0
		}
	}
	return b, nil
}

// isSection tells the keys that hold settings.
func isSection(path string) bool {
	return slices.Contains([]string{"store", "claim", "claim.key_policy", "handler"}, path)
}

// readBroker is brokers.LoadConfig of the file's broker section, or of ""
// without a file. The section is checked on the whole file first, so that
// a mistake is named by its full path and its line.
func readBroker(data, section []byte, fromFile bool) (brokers.Config, error) {
	if !fromFile {
		return brokers.LoadConfig("")
	}
	var strict struct {
		Broker brokers.Config `yaml:"broker"`
		Rest   map[string]any `yaml:",inline"` // the keys ReadFile checked
	}
	if err := config.Decode(data, &strict); err != nil {
		return brokers.Config{}, err
	}
	b, err := config.LoadSection[brokers.Config](section)
	return b, config.Rename(err, func(field string) (string, bool) { return brokerKey + "." + field, isYAMLPath(field) })
}

// isYAMLPath tells "amqp.url" from AMQP_URL.
func isYAMLPath(field string) bool {
	return field != "" && strings.IndexFunc(field, unicode.IsUpper) < 0
}

// named names err's field as the user wrote it, when LoadConfig set it.
func (c Config) named(err error) error {
	return config.Rename(err, func(field string) (string, bool) {
		name, ok := c.names[field]
		return name, ok
	})
}

// pgxReason is what pgx says is wrong with dsn ("invalid port"), without
// the dsn it quotes; a fixed text when it could still show the password.
func pgxReason(err error, dsn string) string {
	const fixed = "not a valid connection string"
	msg := err.Error()
	i := strings.LastIndex(msg, "`: ")
	if !strings.HasPrefix(msg, "cannot parse `") || i < 0 {
		return fixed
	}
	reason := msg[i+len("`: "):]
	for _, pw := range config.Passwords(dsn) {
		if pw != "" && strings.Contains(reason, pw) {
			return fixed
		}
	}
	return reason
}

// String prints the settings as New will use them, passwords redacted.
func (c Config) String() string {
	set := map[bool]string{true: "set", false: "unset"}
	c = groupDefaults(c.withDefaults())
	c.StartupTimeout = cmp.Or(c.StartupTimeout, defaultStartupTimeout)
	c.Store.Schema = cmp.Or(c.Store.Schema, pg.DefaultSchema)
	c.Store.ClaimsTable = cmp.Or(c.Store.ClaimsTable, pg.DefaultClaimsTable)
	c.Store.OutboxTable = cmp.Or(c.Store.OutboxTable, pg.DefaultOutboxTable)
	c.Broker = config.Defaults(c.Broker)
	// The claim's defaults, as middleware.NewClaim applies them.
	cl := c.Claim
	cl.Mode = cmp.Or(cl.Mode, middleware.ModeClaimTable)
	cl.Isolation = cmp.Or(cl.Isolation, pgx.ReadCommitted)
	cl.MaxClaimWait = cmp.Or(cl.MaxClaimWait, pg.DefaultMaxClaimWait)
	// Nothing is sent unset: the session's setting, which only the server knows.
	cl.SynchronousCommit = cmp.Or(cl.SynchronousCommit, "(server default)")
	cl.MaxGroup = cmp.Or(cl.MaxGroup, pg.DefaultMaxGroup)
	cl.MaxGroupTime = cmp.Or(cl.MaxGroupTime, pg.DefaultMaxGroupTime)
	cl.MaxAttempts = cmp.Or(cl.MaxAttempts, pg.DefaultMaxAttempts)
	cl.InitialBackoff = cmp.Or(cl.InitialBackoff, pg.DefaultInitialBackoff)
	cl.MaxBackoff = cmp.Or(cl.MaxBackoff, pg.DefaultMaxBackoff)
	cl.CommittedKeys = cmp.Or(cl.CommittedKeys, committedkeys.DefaultSize)
	cl.CommittedKeysTTL = cmp.Or(cl.CommittedKeysTTL, committedkeys.DefaultTTL)
	cl.KeyPolicy.MaxBytes = cmp.Or(cl.KeyPolicy.MaxBytes, pg.DefaultMaxKeyBytes)
	return fmt.Sprintf("{Name:%q Topic:%q PoisonTopic:%q Key:%q EventTime:%q OrderKey:%q ParkRetry:%s ParkedWarnAge:%s Retention:%s DatabaseURL:%q Pool:%s Store:%+v "+
		"Claim:{Key:%s OrderKey:%s Mode:%q Isolation:%q MaxClaimWait:%s SynchronousCommit:%q MaxGroup:%d MaxGroupTime:%s MaxAttempts:%d InitialBackoff:%s MaxBackoff:%s EventTime:%s "+
		"AllowBrokerEventTime:%t Fingerprint:%t PoisonMemo:%t CommittedKeys:%d CommittedKeysTTL:%s NoPositions:%t ReplayBelowPositions:%t OutboxTopic:%q KeyPolicy:%+v} "+
		"HandlerRetries:%d RetryInitialInterval:%s HandlerTimeout:%s DrainTimeout:%s StartupTimeout:%s Broker:%s "+
		"Extractors:%s OnOutcome:%s Registerer:%s Tracer:%s Logger:%s}",
		c.Name, c.Topic, c.PoisonTopic, c.Key, c.EventTime, c.OrderKey, c.ParkRetry, c.ParkedWarnAge, c.Retention, config.RedactDSN(c.DatabaseURL), set[c.Pool != nil], c.Store,
		set[cl.Key != nil], set[cl.OrderKey != nil], cl.Mode, cl.Isolation, cl.MaxClaimWait, cl.SynchronousCommit, cl.MaxGroup, cl.MaxGroupTime, cl.MaxAttempts, cl.InitialBackoff, cl.MaxBackoff, set[cl.EventTime != nil],
		cl.AllowBrokerEventTime, cl.Fingerprint, cl.PoisonMemo, cl.CommittedKeys, cl.CommittedKeysTTL, cl.NoPositions, cl.ReplayBelowPositions, cl.OutboxTopic, cl.KeyPolicy,
		c.HandlerRetries, c.RetryInitialInterval, c.HandlerTimeout, c.DrainTimeout, c.StartupTimeout, c.Broker,
		set[c.Extractors != nil], set[c.OnOutcome != nil], set[c.Registerer != nil], set[c.Tracer != nil], set[c.Logger != nil])
}

// GoString makes %#v redact too.
func (c Config) GoString() string { return "consumer.Config" + c.String() }
