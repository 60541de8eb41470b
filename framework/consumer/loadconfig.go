package consumer

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"gopkg.in/yaml.v3"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/yamlpath"
	"github.com/claimtx/claimtx/middleware"
)

// LoadConfig reads a consumer's configuration: the YAML file at path
// (none when path is ""), then the environment variables over it, and
// returns the Config they describe, checked: a value that cannot be used
// is a *framework.ConfigError whose Field is what the user wrote, the YAML
// path ("claim.max_claim_wait", "broker.amqp.url") or the variable
// (CLAIM_MAX_CLAIM_WAIT, AMQP_URL). Unknown keys are errors too, so a typo
// never silently falls back to a default. Errors that consumer.New and
// NewBatch return later about a field LoadConfig set are named the same
// way.
//
// The file (examples/loyalty/config.example.yaml documents every key):
//
//	name: loyalty                 # CONSUMER_NAME
//	topic: order-completed        # TOPIC
//	poison_topic: ""              # POISON_TOPIC (default: topic + ".poison")
//	key: template:order-completed:{payload.order_id}   # KEY
//	event_time: json:occurred_at  # EVENT_TIME
//	retention: 720h               # RETENTION (needs event_time)
//	database_url: postgres://app@db/app   # DATABASE_URL or DATABASE_URL_FILE
//	store:
//	  schema: claimtx             # CLAIMTX_SCHEMA
//	  claims_table: processed_messages    # CLAIMTX_CLAIMS_TABLE
//	  outbox_table: outbox        # CLAIMTX_OUTBOX_TABLE
//	claim:
//	  mode: claim_table           # CLAIM_MODE: claim_table | natural_key
//	  isolation: read_committed   # CLAIM_ISOLATION: read_committed | repeatable_read | serializable
//	  max_claim_wait: 5s          # CLAIM_MAX_CLAIM_WAIT
//	  max_attempts: 5             # CLAIM_MAX_ATTEMPTS
//	  initial_backoff: 10ms       # CLAIM_INITIAL_BACKOFF
//	  max_backoff: 1s             # CLAIM_MAX_BACKOFF
//	  allow_broker_event_time: false      # CLAIM_ALLOW_BROKER_EVENT_TIME
//	  fingerprint: false          # CLAIM_FINGERPRINT
//	  poison_memo: false          # POISON_MEMO
//	  committed_keys: 100000      # CLAIM_COMMITTED_KEYS (-1: no committed-key cache)
//	  committed_keys_ttl: 10m     # CLAIM_COMMITTED_KEYS_TTL
//	  no_positions: false         # CLAIM_NO_POSITIONS (Kafka positions stored with the claims)
//	  replay_below_positions: false       # CLAIM_REPLAY_BELOW_POSITIONS
//	  outbox_topic: ""            # CLAIM_OUTBOX_TOPIC
//	  key_policy:
//	    max_bytes: 512            # CLAIM_KEY_MAX_BYTES
//	    hash_overlong: false      # CLAIM_KEY_HASH_OVERLONG
//	handler:
//	  retries: 3                  # HANDLER_RETRIES
//	  retry_initial_interval: 100ms       # HANDLER_RETRY_INITIAL_INTERVAL
//	  timeout: 0s                 # HANDLER_TIMEOUT
//	drain_timeout: 15s            # DRAIN_TIMEOUT
//	startup_timeout: 30s          # STARTUP_TIMEOUT
//	broker:                       # brokers.LoadConfigFile's format, and its variables
//	  kind: amqp
//	  amqp: {url: amqp://app@rabbit:5672/, queue_type: quorum}
//
// A key left out, or a variable unset or empty, keeps the Config field's
// default (see each field). Durations are Go durations ("250ms", "720h").
// The broker section is read by brokers.LoadConfig, so BROKER, AMQP_URL,
// KAFKA_BROKERS and every other variable of package brokers apply; without
// a file it is brokers.ConfigFromEnv.
//
// Secrets: database_url, like the broker's URL and SASL password, may
// hold a password. Each can come from the file, from its variable, or from
// a file its _FILE variable names (DATABASE_URL_FILE, AMQP_URL_FILE,
// KAFKA_SASL_PASSWORD_FILE: a mounted Docker or Kubernetes secret);
// setting a variable and its _FILE variable is an error. Config.String and
// every error LoadConfig returns leave the passwords out.
//
// Key and EventTime are kept as specs and parsed by New with
// Config.Extractors, so they may name extractors you register; set
// Extractors, Pool, Logger, OnOutcome and the rest in code on the
// returned Config.
func LoadConfig(path string) (Config, error) {
	l := loader{lookup: os.LookupEnv, names: map[string]string{}, fromFile: path != ""}
	var data []byte
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil { //nolint:gosec // reading the file the caller names is the point
			return Config{}, fmt.Errorf("consumer: read config: %w", err)
		}
	}
	c, err := l.load(data)
	if err != nil {
		if path != "" {
			var ce *framework.ConfigError
			if !errors.As(err, &ce) {
				return Config{}, fmt.Errorf("consumer: config file %s: %w", path, err)
			}
		}
		return Config{}, err
	}
	return c, nil
}

// setting is one key of the file and its variable.
type setting struct {
	path  string                          // YAML path: "claim.max_claim_wait"
	env   string                          // variable: "CLAIM_MAX_CLAIM_WAIT"
	field string                          // the name errors about it use elsewhere: "Claim.MaxClaimWait"
	set   func(c *Config, v string) error // parses v (a YAML scalar or a variable) into c
	// secret: never quoted in errors; may come from env+"_FILE".
	secret bool
}

// settings are the keys of the file, in the order of the documentation.
// Each set func returns a plain error whose text is the reason; the loader
// turns it into a *framework.ConfigError naming the path or the variable.
var settings = []setting{
	{path: "name", env: "CONSUMER_NAME", field: "Name", set: func(c *Config, v string) error { c.Name = v; return nil }},
	{path: "topic", env: "TOPIC", field: "Topic", set: func(c *Config, v string) error { c.Topic = v; return nil }},
	{path: "poison_topic", env: "POISON_TOPIC", field: "PoisonTopic", set: func(c *Config, v string) error { c.PoisonTopic = v; return nil }},
	{path: "key", env: "KEY", field: "Key", set: func(c *Config, v string) error { c.Key = v; return nil }},
	{path: "event_time", env: "EVENT_TIME", field: "EventTime", set: func(c *Config, v string) error { c.EventTime = v; return nil }},
	{path: "retention", env: "RETENTION", field: "Retention", set: durationAtLeast(0, func(c *Config) *time.Duration { return &c.Retention })},
	{path: "database_url", env: "DATABASE_URL", field: "DatabaseURL", secret: true, set: func(c *Config, v string) error {
		if _, err := pgxpool.ParseConfig(v); err != nil {
			return safeError{msg: pgxReason(err, v), err: err}
		}
		c.DatabaseURL = v
		return nil
	}},
	{path: "store.schema", env: "CLAIMTX_SCHEMA", field: "Schema", set: func(c *Config, v string) error { c.Store.Schema = v; return nil }},
	{path: "store.claims_table", env: "CLAIMTX_CLAIMS_TABLE", field: "ClaimsTable", set: func(c *Config, v string) error { c.Store.ClaimsTable = v; return nil }},
	{path: "store.outbox_table", env: "CLAIMTX_OUTBOX_TABLE", field: "OutboxTable", set: func(c *Config, v string) error { c.Store.OutboxTable = v; return nil }},
	{path: "claim.mode", env: "CLAIM_MODE", field: "Claim.Mode", set: func(c *Config, v string) error {
		switch m := middleware.ClaimMode(v); m {
		case middleware.ModeClaimTable, middleware.ModeNaturalKey:
			c.Claim.Mode = m
			return nil
		}
		return fmt.Errorf("must be %s or %s, got %q", middleware.ModeClaimTable, middleware.ModeNaturalKey, v)
	}},
	{path: "claim.isolation", env: "CLAIM_ISOLATION", field: "Claim.Isolation", set: func(c *Config, v string) error {
		levels := map[string]pgx.TxIsoLevel{"read_committed": pgx.ReadCommitted, "repeatable_read": pgx.RepeatableRead, "serializable": pgx.Serializable}
		l, ok := levels[strings.ToLower(v)]
		if !ok {
			return fmt.Errorf("must be read_committed, repeatable_read or serializable, got %q", v)
		}
		c.Claim.Isolation = l
		return nil
	}},
	{path: "claim.max_claim_wait", env: "CLAIM_MAX_CLAIM_WAIT", field: "Claim.MaxClaimWait", set: durationAtLeast(1, func(c *Config) *time.Duration { return &c.Claim.MaxClaimWait })},
	{path: "claim.max_attempts", env: "CLAIM_MAX_ATTEMPTS", field: "Claim.MaxAttempts", set: intAtLeast(1, func(c *Config) *int { return &c.Claim.MaxAttempts })},
	{path: "claim.initial_backoff", env: "CLAIM_INITIAL_BACKOFF", field: "Claim.InitialBackoff", set: durationAtLeast(1, func(c *Config) *time.Duration { return &c.Claim.InitialBackoff })},
	{path: "claim.max_backoff", env: "CLAIM_MAX_BACKOFF", field: "Claim.MaxBackoff", set: durationAtLeast(1, func(c *Config) *time.Duration { return &c.Claim.MaxBackoff })},
	{path: "claim.allow_broker_event_time", env: "CLAIM_ALLOW_BROKER_EVENT_TIME", field: "Claim.AllowBrokerEventTime", set: boolean(func(c *Config) *bool { return &c.Claim.AllowBrokerEventTime })},
	{path: "claim.fingerprint", env: "CLAIM_FINGERPRINT", field: "Claim.Fingerprint", set: boolean(func(c *Config) *bool { return &c.Claim.Fingerprint })},
	{path: "claim.poison_memo", env: "POISON_MEMO", field: "Claim.PoisonMemo", set: boolean(func(c *Config) *bool { return &c.Claim.PoisonMemo })},
	{path: "claim.committed_keys", env: "CLAIM_COMMITTED_KEYS", field: "Claim.CommittedKeys", set: intAtLeast(-1, func(c *Config) *int { return &c.Claim.CommittedKeys })},
	{path: "claim.committed_keys_ttl", env: "CLAIM_COMMITTED_KEYS_TTL", field: "Claim.CommittedKeysTTL", set: durationAtLeast(1, func(c *Config) *time.Duration { return &c.Claim.CommittedKeysTTL })},
	{path: "claim.no_positions", env: "CLAIM_NO_POSITIONS", field: "Claim.NoPositions", set: boolean(func(c *Config) *bool { return &c.Claim.NoPositions })},
	{path: "claim.replay_below_positions", env: "CLAIM_REPLAY_BELOW_POSITIONS", field: "Claim.ReplayBelowPositions", set: boolean(func(c *Config) *bool { return &c.Claim.ReplayBelowPositions })},
	{path: "claim.outbox_topic", env: "CLAIM_OUTBOX_TOPIC", field: "Claim.OutboxTopic", set: func(c *Config, v string) error { c.Claim.OutboxTopic = v; return nil }},
	{path: "claim.key_policy.max_bytes", env: "CLAIM_KEY_MAX_BYTES", field: "Claim.KeyPolicy.MaxBytes", set: intAtLeast(1, func(c *Config) *int { return &c.Claim.KeyPolicy.MaxBytes })},
	{path: "claim.key_policy.hash_overlong", env: "CLAIM_KEY_HASH_OVERLONG", field: "Claim.KeyPolicy.HashOverlong", set: boolean(func(c *Config) *bool { return &c.Claim.KeyPolicy.HashOverlong })},
	{path: "handler.retries", env: "HANDLER_RETRIES", field: "HandlerRetries", set: intAtLeast(0, func(c *Config) *int { return &c.HandlerRetries })},
	{path: "handler.retry_initial_interval", env: "HANDLER_RETRY_INITIAL_INTERVAL", field: "RetryInitialInterval", set: durationAtLeast(1, func(c *Config) *time.Duration { return &c.RetryInitialInterval })},
	{path: "handler.timeout", env: "HANDLER_TIMEOUT", field: "HandlerTimeout", set: durationAtLeast(0, func(c *Config) *time.Duration { return &c.HandlerTimeout })},
	{path: "drain_timeout", env: "DRAIN_TIMEOUT", field: "DrainTimeout", set: durationAtLeast(1, func(c *Config) *time.Duration { return &c.DrainTimeout })},
	{path: "startup_timeout", env: "STARTUP_TIMEOUT", field: "StartupTimeout", set: func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d == 0 {
			return fmt.Errorf("must be a duration like 30s, not 0 (negative: one attempt), got %q", v)
		}
		c.StartupTimeout = d
		return nil
	}},
}

// brokerKey is the section of the file brokers.LoadConfig reads.
const brokerKey = "broker"

// aliases are the other names errors use for a setting's field: the
// extractor registry names spec errors "key" and "event_time", and the
// claim middleware's EventTime errors come out as "Claim.EventTime".
var aliases = map[string][]string{
	"Key":       {"key"},
	"EventTime": {"event_time", "Claim.EventTime"},
}

func durationAtLeast(min time.Duration, dst func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		switch {
		case err != nil:
			return fmt.Errorf("must be a duration like 500ms or 2s, got %q", v)
		case d < min && min > 0:
			return fmt.Errorf("must be positive, got %s", v)
		case d < min:
			return fmt.Errorf("must not be negative, got %s", v)
		}
		*dst(c) = d
		return nil
	}
}

func intAtLeast(min int, dst func(*Config) *int) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < min {
			return fmt.Errorf("must be an integer of at least %d, got %q", min, v)
		}
		*dst(c) = n
		return nil
	}
}

func boolean(dst func(*Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("must be true or false, got %q", v)
		}
		*dst(c) = b
		return nil
	}
}

// loader is one LoadConfig call.
type loader struct {
	lookup   func(string) (string, bool)
	fromFile bool
	// names is the Config's names: Go field -> path or variable.
	names map[string]string
}

// load builds the Config from data (the file; nil without one) and the
// environment.
func (l *loader) load(data []byte) (Config, error) {
	var c Config
	byPath := make(map[string]setting, len(settings))
	for _, s := range settings {
		byPath[s.path] = s
		// What to call a field nobody set: the key of the file in use,
		// else the variable that would set it.
		l.name(s, s.env)
		if l.fromFile {
			l.name(s, s.path)
		}
	}
	brokerSection, err := l.readFile(data, byPath, &c)
	if err != nil {
		return Config{}, err
	}
	for _, s := range settings {
		if err := l.applyEnv(s, &c); err != nil {
			return Config{}, err
		}
	}
	if err := l.readBroker(data, brokerSection, &c); err != nil {
		return Config{}, err
	}
	if err := l.check(c); err != nil {
		return Config{}, err
	}
	c.names = l.names
	return c, nil
}

// name records that errors about s's field should say name.
func (l *loader) name(s setting, name string) {
	l.names[s.field] = name
	for _, a := range aliases[s.field] {
		l.names[a] = name
	}
}

// readFile applies the file's settings to c and returns its broker
// section (nil when there is none). Keys are checked against the settings,
// so an unknown or misplaced one is named by its path and line.
func (l *loader) readFile(data []byte, byPath map[string]setting, c *Config) (*yaml.Node, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, nil
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, fmt.Errorf("parse YAML: %w", err)
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, errors.New("parse YAML: more than one document")
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, nil
	}
	var brokerSection *yaml.Node
	var walk func(n *yaml.Node, prefix string) error
	walk = func(n *yaml.Node, prefix string) error {
		if n.Kind == yaml.AliasNode {
			n = n.Alias
		}
		if n.Kind != yaml.MappingNode {
			what := "the file"
			if prefix != "" {
				what = strings.TrimSuffix(prefix, ".")
			}
			return &framework.ConfigError{Field: orRoot(what), Reason: fmt.Sprintf("must be a mapping of keys (line %d)", n.Line)}
		}
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			path := prefix + k.Value
			if k.Value == "<<" {
				return &framework.ConfigError{Field: orRoot(strings.TrimSuffix(prefix, ".")), Reason: fmt.Sprintf("merge keys (<<) are not supported (line %d)", k.Line)}
			}
			if seen[k.Value] {
				return &framework.ConfigError{Field: path, Reason: fmt.Sprintf("is set twice (line %d)", k.Line)}
			}
			seen[k.Value] = true
			if v.Kind == yaml.AliasNode {
				v = v.Alias
			}
			switch {
			case path == brokerKey:
				brokerSection = v
			case isSection(path):
				if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
					continue
				}
				if err := walk(v, path+"."); err != nil {
					return err
				}
			default:
				s, ok := byPath[path]
				if !ok {
					return &framework.ConfigError{Field: path, Reason: fmt.Sprintf("unknown key (line %d)", k.Line)}
				}
				if v.Kind != yaml.ScalarNode {
					return &framework.ConfigError{Field: path, Reason: fmt.Sprintf("must be a single value (line %d)", v.Line)}
				}
				if v.Tag == "!!null" {
					continue // "key:" with nothing after it: the default
				}
				if err := s.set(c, v.Value); err != nil {
					return &framework.ConfigError{Field: path, Reason: fmt.Sprintf("%s (line %d)", reasonOf(s, err), v.Line), Err: errOf(err)}
				}
			}
		}
		return nil
	}
	if err := walk(root, ""); err != nil {
		return nil, err
	}
	return brokerSection, nil
}

// isSection tells the keys that hold settings rather than being one.
func isSection(path string) bool {
	switch path {
	case "store", "claim", "claim.key_policy", "handler":
		return true
	}
	return false
}

func orRoot(path string) string {
	if path == "" {
		return "(root)"
	}
	return path
}

// applyEnv applies s's variable, or its _FILE variable for a secret.
func (l *loader) applyEnv(s setting, c *Config) error {
	get := func(name string) (string, bool) {
		v, ok := l.lookup(name)
		v = strings.TrimSpace(v)
		return v, ok && v != ""
	}
	v, ok := get(s.env)
	name := s.env
	if s.secret {
		fileVar := s.env + "_FILE"
		if p, fromFile := get(fileVar); fromFile {
			if ok {
				return &framework.ConfigError{Field: fileVar, Reason: fmt.Sprintf("set %s or %s, not both", s.env, fileVar)}
			}
			b, err := os.ReadFile(p) //nolint:gosec // reading the file the operator names is the point
			if err != nil {
				// *fs.PathError names the path and the cause, never the content.
				return &framework.ConfigError{Field: fileVar, Reason: fmt.Sprintf("cannot read the file: %v", err)}
			}
			// A trailing newline is what editors and `echo` leave behind.
			if v = strings.TrimSpace(string(b)); v == "" {
				return &framework.ConfigError{Field: fileVar, Reason: fmt.Sprintf("the file %s is empty", p)}
			}
			ok, name = true, fileVar
		}
	}
	if !ok {
		return nil
	}
	if err := s.set(c, v); err != nil {
		return &framework.ConfigError{Field: name, Reason: reasonOf(s, err), Err: errOf(err)}
	}
	l.name(s, name)
	return nil
}

// readBroker builds c.Broker: brokers.LoadConfig of the file's broker
// section, or brokers.ConfigFromEnv without a file. The section is checked
// against brokers.Config's keys first, on the whole file, so that an
// unknown key or a bad value is named by its full path and its line.
func (l *loader) readBroker(data []byte, section *yaml.Node, c *Config) error {
	if !l.fromFile {
		b, err := brokers.ConfigFromEnv()
		if err != nil {
			return err
		}
		c.Broker = b
		return nil
	}
	var strict struct {
		Broker brokers.Config `yaml:"broker"`
		Rest   map[string]any `yaml:",inline"` // the keys readFile checked
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&strict); err != nil && !errors.Is(err, io.EOF) {
		if ce := yamlpath.FieldError(data, err); ce != nil {
			return ce
		}
		return fmt.Errorf("parse YAML: %w", err)
	}
	var sub []byte
	if section != nil {
		// Through a plain value, so that aliases to anchors outside the
		// section are resolved before it stands alone.
		var v any
		if err := section.Decode(&v); err != nil {
			return fmt.Errorf("parse YAML: %w", err)
		}
		var err error
		if sub, err = yaml.Marshal(v); err != nil {
			return fmt.Errorf("parse YAML: %w", err)
		}
	}
	b, err := brokers.LoadConfig(sub)
	if err != nil {
		var ce *framework.ConfigError
		if errors.As(err, &ce) && isYAMLPath(ce.Field) {
			out := *ce
			out.Field = brokerKey + "." + ce.Field
			return &out
		}
		return err
	}
	c.Broker = b
	return nil
}

// isYAMLPath tells a field named by its YAML path ("amqp.url") from one
// named by its variable (AMQP_URL).
func isYAMLPath(field string) bool {
	return field != "" && strings.IndexFunc(field, unicode.IsUpper) < 0
}

// check runs what New would refuse about the fields LoadConfig set and
// that code cannot complete later (the store names), so a file's mistake
// is reported before anything connects.
func (l *loader) check(c Config) error {
	c.names = l.names
	return c.named(c.Store.Validate())
}

// named returns err with the Field of its *framework.ConfigError replaced
// by what the user wrote, when LoadConfig set that field (see names).
func (c Config) named(err error) error {
	var ce *framework.ConfigError
	if err == nil || c.names == nil || !errors.As(err, &ce) {
		return err
	}
	name, ok := c.names[ce.Field]
	if !ok {
		return err
	}
	out := *ce
	out.Field = name
	return &out
}

// reasonOf is the reason a setting's parse error gives: its text, except
// for a secret's, whose text may quote it. A secret's errors are
// safeErrors, wrapped as the ConfigError's Err (errOf).
func reasonOf(s setting, err error) string {
	var se safeError
	if s.secret || errors.As(err, &se) {
		return "cannot be used"
	}
	return err.Error()
}

// errOf is what the *framework.ConfigError for a parse error wraps: the
// safeError of a secret, nothing otherwise (the reason says it all).
func errOf(err error) error {
	var se safeError
	if errors.As(err, &se) {
		return se
	}
	return nil
}

// safeError is an error whose text is known not to hold a secret; Unwrap
// still reaches the original (for errors.As), whose text may.
type safeError struct {
	msg string
	err error
}

func (e safeError) Error() string { return e.msg }
func (e safeError) Unwrap() error { return e.err }

// databaseURLError is the error for a DatabaseURL pgx refuses, without
// pgx's own text, which quotes the connection string and redacts its
// password only as far as it can parse it.
func databaseURLError(field, dsn string, err error) error {
	return &framework.ConfigError{Field: field, Reason: "cannot be used", Err: safeError{msg: pgxReason(err, dsn), err: err}}
}

// pgxReason is what pgx says is wrong with dsn, without the connection
// string it quotes: "invalid port", "failed to configure TLS (sslmode is
// invalid)". It gives a fixed text when that could still show the
// password.
func pgxReason(err error, dsn string) string {
	const fixed = "not a valid connection string"
	msg := err.Error()
	i := strings.LastIndex(msg, "`: ")
	if !strings.HasPrefix(msg, "cannot parse `") || i < 0 {
		return fixed
	}
	reason := msg[i+len("`: "):]
	for _, pw := range passwordsIn(dsn) {
		if pw != "" && strings.Contains(reason, pw) {
			return fixed
		}
	}
	return reason
}

// kvPassword finds the password of a keyword/value connection string.
var kvPassword = regexp.MustCompile(`password\s*=\s*('(?:[^'\\]|\\.)*'?|\S+)`)

// passwordsIn returns the passwords dsn may hold, as best it can tell:
// the URL's userinfo and password parameter, or keyword/value passwords
// (quoted or not, and their unquoted parts).
func passwordsIn(dsn string) []string {
	var out []string
	if u, err := url.Parse(dsn); err == nil {
		if u.User != nil {
			if pw, ok := u.User.Password(); ok {
				out = append(out, pw)
			}
		}
		out = append(out, u.Query()["password"]...)
	}
	for _, m := range kvPassword.FindAllStringSubmatch(dsn, -1) {
		v := strings.Trim(m[1], "'")
		out = append(out, v)
		out = append(out, strings.Fields(v)...)
	}
	// The raw userinfo too, when the URL does not parse.
	if at := strings.LastIndex(dsn, "@"); at > 0 {
		if i := strings.Index(dsn, "://"); i >= 0 && i+3 < at {
			if _, pw, ok := strings.Cut(dsn[i+3:at], ":"); ok {
				out = append(out, pw)
			}
		}
	}
	return out
}

// redactDatabaseURL returns dsn with its passwords replaced by xxxxx:
// the URL's userinfo password and password parameter, or the password of
// a keyword/value string. Whatever it cannot take apart has every
// password it finds replaced wherever it occurs.
func redactDatabaseURL(dsn string) string {
	const mask = "xxxxx"
	if dsn == "" {
		return ""
	}
	out := ""
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		if u.User != nil {
			if _, ok := u.User.Password(); ok {
				u.User = url.UserPassword(u.User.Username(), mask)
			}
		}
		if q := u.Query(); q.Has("password") {
			q.Set("password", mask)
			u.RawQuery = q.Encode()
		}
		out = u.String()
	} else if !strings.Contains(dsn, "://") {
		out = kvPassword.ReplaceAllString(dsn, "password="+mask)
	}
	pws := passwordsIn(dsn)
	for _, pw := range pws {
		if pw != "" && out != "" && strings.Contains(out, pw) {
			out = "" // a password survived: fall back to the blunt way
		}
	}
	if out == "" {
		out = dsn
		for _, pw := range pws {
			if pw != "" {
				out = strings.ReplaceAll(out, pw, mask)
			}
		}
	}
	return out
}

// String prints the settings LoadConfig reads, with the passwords of
// DatabaseURL and of the broker (see brokers.Config.String) redacted, so
// logging the effective configuration at start-up is safe. Pool, the
// registries, the hooks, Tracer and Logger are only said to be set.
func (c Config) String() string {
	set := func(b bool) string {
		if b {
			return "set"
		}
		return "unset"
	}
	cl := c.Claim
	return fmt.Sprintf("{Name:%q Topic:%q PoisonTopic:%q Key:%q EventTime:%q Retention:%s DatabaseURL:%q Pool:%s Store:%+v "+
		"Claim:{Key:%s Mode:%q Isolation:%q MaxClaimWait:%s MaxAttempts:%d InitialBackoff:%s MaxBackoff:%s EventTime:%s "+
		"AllowBrokerEventTime:%t Fingerprint:%t PoisonMemo:%t CommittedKeys:%d CommittedKeysTTL:%s NoPositions:%t ReplayBelowPositions:%t OutboxTopic:%q KeyPolicy:%+v} "+
		"HandlerRetries:%d RetryInitialInterval:%s HandlerTimeout:%s DrainTimeout:%s StartupTimeout:%s Broker:%s "+
		"Brokers:%s Extractors:%s OnOutcome:%s Registerer:%s Tracer:%s Logger:%s}",
		c.Name, c.Topic, c.PoisonTopic, c.Key, c.EventTime, c.Retention, redactDatabaseURL(c.DatabaseURL), set(c.Pool != nil), c.Store,
		set(cl.Key != nil), cl.Mode, cl.Isolation, cl.MaxClaimWait, cl.MaxAttempts, cl.InitialBackoff, cl.MaxBackoff, set(cl.EventTime != nil),
		cl.AllowBrokerEventTime, cl.Fingerprint, cl.PoisonMemo, cl.CommittedKeys, cl.CommittedKeysTTL, cl.NoPositions, cl.ReplayBelowPositions, cl.OutboxTopic, cl.KeyPolicy,
		c.HandlerRetries, c.RetryInitialInterval, c.HandlerTimeout, c.DrainTimeout, c.StartupTimeout, c.Broker,
		set(c.Brokers != nil), set(c.Extractors != nil), set(c.OnOutcome != nil), set(c.Registerer != nil), set(c.Tracer != nil), set(c.Logger != nil))
}

// GoString makes %#v redact too.
func (c Config) GoString() string { return "consumer.Config" + c.String() }
