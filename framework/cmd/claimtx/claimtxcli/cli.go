package claimtxcli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
	"github.com/claimtx/claimtx/internal/config"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store"
)

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

const usage = `claimtx: operator CLI for the claimtx claim table

Usage:
  claimtx migrate                      create or upgrade claimtx's schema
  claimtx cleanup [flags]              delete claims older than the retention window, in batches
  claimtx partitions list              list the partitions of a partitioned claim table
  claimtx partitions enable [flags]    convert the claim table to event-day partitions
  claimtx partitions create-ahead      create missing day partitions through today + --ahead
  claimtx partitions drop-expired      drop day partitions past the retention window
  claimtx stats [--json]               claims per consumer, table and index size, Kafka positions
  claimtx dlq list|inspect|replay      browse, classify and replay a consumer's dead letters
  claimtx keys check                   verify a key spec against a sample of messages
  claimtx unpoison --consumer C        clear poison memos: the next copies run the handler again
  claimtx explain --consumer C --key K a message's claim, transaction, outbox rows and poison memo
  claimtx console [flags]              serve the web console: overview, key look-up, dead letters and replay

Every command that reads the claims takes:
  --database-url URL   Postgres connection string (env DATABASE_URL)
  --schema NAME        claimtx schema (env CLAIMTX_SCHEMA, default claimtx)
  --table NAME         claim table (env CLAIMTX_TABLE, default processed_messages)

Durations accept Go syntax (36h, 90m) and days (30d, 1d12h).
Run "claimtx COMMAND -h" for a command's flags.
`

// usageError is bad input: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// env is the process environment, injected so tests can run in parallel.
type env func(string) string

func runEnv(ctx context.Context, cfg Config, args []string, stdout, stderr io.Writer, getenv env) int {
	if len(args) == 0 {
		printTo(stderr, usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "help", "-h", "--help":
		printTo(stdout, usage)
		return exitOK
	}
	c, ok := commands[cmd]
	if !ok {
		printf(stderr, "claimtx: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
	if cfg.Extractors == nil {
		cfg.Extractors = framework.NewRegistry()
	}
	return report(c(ctx, rest, stdout, stderr, getenv, cfg), stderr)
}

// command is one subcommand: it writes its output to stdout (dlq its
// progress to stderr), resolves specs and browses brokers as cfg says, and
// returns its error, already redacted, for report.
type command func(ctx context.Context, args []string, stdout, stderr io.Writer, getenv env, cfg Config) error

var commands = map[string]command{
	"migrate": cmdMigrate, "cleanup": cmdCleanup, "partitions": cmdPartitions, "stats": cmdStats, "dlq": cmdDLQ,
	"keys": cmdKeys, "unpoison": cmdUnpoison, "parked": cmdParked, "explain": cmdExplain, "console": cmdConsole,
}

// report prints err and maps it to an exit status.
func report(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	printlnTo(stderr, oncePrefixed(err.Error()))
	var ue *usageError
	var ce *framework.ConfigError
	if errors.As(err, &ue) || errors.As(err, &ce) {
		return exitUsage
	}
	return exitFail
}

// oncePrefixed puts "claimtx: " in front of msg exactly once: the store's
// errors carry it themselves (for application logs).
func oncePrefixed(msg string) string {
	for {
		trimmed := strings.ReplaceAll(strings.TrimPrefix(msg, "claimtx: "), ": claimtx: ", ": ")
		if trimmed == msg {
			return "claimtx: " + msg
		}
		msg = trimmed
	}
}

// common holds the connection flags and, once connected, the pool.
type common struct {
	databaseURL, schema, table string
	getenv                     env
	stdout                     io.Writer
	pool                       *pgxpool.Pool
}

// newFlags is the flag set of the (sub)command name with the connection
// flags.
func newFlags(name string, stdout io.Writer, getenv env) (*flag.FlagSet, *common) {
	fs := quietFlagSet(name)
	c := &common{getenv: getenv, stdout: stdout}
	// The environment is read after parsing, not used as flag defaults:
	// -h and flag errors print defaults, and DATABASE_URL holds a password.
	fs.StringVar(&c.databaseURL, "database-url", "", "Postgres connection string (env DATABASE_URL)")
	fs.StringVar(&c.schema, "schema", "", "claimtx schema (env CLAIMTX_SCHEMA; default claimtx)")
	fs.StringVar(&c.table, "table", "", "claim table (env CLAIMTX_TABLE; default processed_messages)")
	return fs, c
}

// quietFlagSet neither prints nor exits (package flag would print the
// usage around every error): parse and printHelp print.
func quietFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// subcommand splits the subcommand of a group (partitions, dlq, keys) from
// args; help prints usage on stdout and returns flag.ErrHelp.
func subcommand(group, usage string, args []string, stdout io.Writer, subs ...string) (string, []string, error) {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		printTo(stdout, usage)
		return "", nil, flag.ErrHelp
	}
	want := subs[len(subs)-1]
	if len(subs) > 1 {
		want = strings.Join(subs[:len(subs)-1], ", ") + " or " + want
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		them := "them"
		if len(subs) == 1 {
			them = "it"
		}
		return "", nil, &usageError{msg: fmt.Sprintf("%s: want a subcommand: %s\nrun `claimtx %s -h` for %s", group, want, group, them)}
	}
	if !slices.Contains(subs, args[0]) {
		return "", nil, &usageError{msg: fmt.Sprintf("%s: unknown subcommand %q (want %s)", group, args[0], want)}
	}
	return args[0], args[1:], nil
}

func (c *common) fromEnv() {
	c.databaseURL = cmp.Or(c.databaseURL, c.getenv("DATABASE_URL"))
	c.schema = cmp.Or(c.schema, c.getenv("CLAIMTX_SCHEMA"))
	c.table = cmp.Or(c.table, c.getenv("CLAIMTX_TABLE"))
}

// parse parses args and refuses positional leftovers. -h goes to stdout,
// so it can be paged; a bad flag is one line and a pointer to the help.
func (c *common) parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(c.stdout, fs)
			return err
		}
		return badFlags(fs.Name(), "%v", err)
	}
	if fs.NArg() > 0 {
		return badFlags(fs.Name(), "unexpected argument %q", fs.Arg(0))
	}
	return nil
}

func badFlags(name, format string, a ...any) error {
	return &usageError{msg: name + ": " + fmt.Sprintf(format, a...) + "\nrun `claimtx " + name + " -h` for its flags"}
}

func requireConsumer(cmd, consumer string) error {
	if consumer == "" {
		return badFlags(cmd, "--consumer is required")
	}
	return config.ValidateConsumer("--consumer", consumer)
}

// synopses are the descriptions of the commands' help, set by their files.
var synopses = map[string]string{}

// printHelp is the only place defaults are printed: a flag's help text
// never repeats its default.
func printHelp(w io.Writer, fs *flag.FlagSet) {
	printf(w, "Usage: claimtx %s [flags]\n\n%s\n\nFlags:\n", fs.Name(), synopses[fs.Name()])
	fs.VisitAll(func(f *flag.Flag) {
		arg, text := flag.UnquoteUsage(f)
		if _, ok := f.Value.(*durationValue); ok {
			arg = "duration"
		}
		line := "  --" + f.Name
		if arg != "" {
			line += " " + strings.ToUpper(arg)
		}
		switch f.DefValue {
		case "", "0", "0s", "false":
		default:
			text += " (default " + f.DefValue + ")"
		}
		printf(w, "%s\n      %s\n", line, text)
	})
}

// connect validates the names and opens a small pool (a leader connection
// and one for everything else). Errors never contain the password.
func (c *common) connect(ctx context.Context) (*store.Store, func(), error) {
	c.fromEnv()
	cfg := store.Config{Schema: c.schema, ClaimsTable: c.table}
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	if c.databaseURL == "" {
		return nil, nil, &usageError{msg: "no database: set DATABASE_URL or pass --database-url"}
	}
	st, err := c.open(ctx, 2, "claimtx-cli", "")
	if err != nil {
		return nil, nil, err
	}
	return st, c.pool.Close, nil
}

// open connects c.pool (maxConns, application_name app) and returns the
// store over it. Errors start with prefix and never contain the password.
func (c *common) open(ctx context.Context, maxConns int32, app, prefix string) (*store.Store, error) {
	pcfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return nil, &usageError{msg: c.redact(fmt.Sprintf("%sinvalid database URL: %v", prefix, err))}
	}
	pcfg.MaxConns = maxConns
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	if !strings.Contains(c.databaseURL, "default_query_exec_mode") {
		// pgx caches prepared statements per connection, which a
		// transaction pooler cannot keep; one Parse per statement costs an
		// operator's tool nothing it would notice.
		pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, errors.New(c.redact(fmt.Sprintf("%sconnect: %v", prefix, err)))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, errors.New(c.redact(fmt.Sprintf("%sconnect to %s: %v", prefix, target(pcfg), err)))
	}
	st, err := store.New(pool, store.Config{Schema: c.schemaName(), ClaimsTable: c.tableName()})
	if err != nil {
		pool.Close()
		return nil, err
	}
	c.pool = pool
	return st, nil
}

// migrated refuses a missing claim table, with the remedy, before a
// broker is touched.
func (c *common) migrated(ctx context.Context, st *store.Store, what string) error {
	v, err := st.Version(ctx)
	if err != nil {
		return c.fail(ctx, what, err)
	}
	if v == 0 {
		return errors.New(c.redact(what + ": " + c.missingTable(ctx)))
	}
	return nil
}

// fail wraps a command's error, redacted and still matchable. The store's
// texts for a missing or (not) partitioned table advise the Go API and
// name no table: these name it and the CLI's remedy.
func (c *common) fail(ctx context.Context, what string, err error) error {
	var ce *framework.ConfigError
	if errors.As(err, &ce) {
		return err
	}
	name, msg := c.schemaName()+"."+c.tableName(), err.Error()
	switch {
	case errors.Is(err, store.ErrNoClaimTable):
		msg = c.missingTable(ctx)
	case errors.Is(err, store.ErrNotPartitioned):
		msg = "claim table " + name + " is not partitioned: run `claimtx partitions enable` first, or keep it plain and use `claimtx cleanup`"
	case errors.Is(err, store.ErrPartitioned):
		msg = "claim table " + name + " is partitioned: retention drops whole day partitions, not rows; use `claimtx partitions drop-expired`"
	}
	return &redactedError{msg: c.redact(what + ": " + msg), err: err}
}

func (c *common) missingTable(ctx context.Context) string {
	name := c.schemaName() + "." + c.tableName()
	var schemaExists bool
	err := c.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", c.schemaName()).Scan(&schemaExists)
	if err == nil && !schemaExists {
		return fmt.Sprintf("schema %q does not exist, so neither does the claim table %s: run `claimtx migrate` to create both, or pass the --schema it was created with (env CLAIMTX_SCHEMA)", c.schemaName(), name)
	}
	return fmt.Sprintf("claim table %s does not exist: run `claimtx migrate` to create it, or pass the --schema and --table it was created with (env CLAIMTX_SCHEMA, CLAIMTX_TABLE)", name)
}

func (c *common) schemaName() string { return cmp.Or(c.schema, pg.DefaultSchema) }
func (c *common) tableName() string  { return cmp.Or(c.table, pg.DefaultClaimsTable) }

// brokerFlags select the broker of dlq, keys and stats.
type brokerFlags struct {
	broker, brokerFile    string
	amqpURL, kafkaBrokers string
	brokerSecrets         []string
}

func (b *brokerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&b.broker, "broker", "", "broker kind: amqp, kafka or nats (env BROKER; default amqp; NATS_URL and the other NATS_ variables set nats)")
	fs.StringVar(&b.brokerFile, "broker-config", "", "broker configuration file (YAML, see brokers.LoadConfig); the environment overrides it")
	fs.StringVar(&b.amqpURL, "amqp-url", "", "RabbitMQ URL (env AMQP_URL)")
	fs.StringVar(&b.kafkaBrokers, "kafka-brokers", "", "Kafka bootstrap addresses, comma separated (env KAFKA_BROKERS)")
}

// brokerConfig is the file (or the defaults), the environment over it
// (brokers.LoadConfig), and the flags over both.
func (b *brokerFlags) brokerConfig() (brokers.Config, error) {
	cfg, err := brokers.LoadConfig(b.brokerFile)
	if err != nil {
		return cfg, err
	}
	cfg.Kind, cfg.AMQP.URL = cmp.Or(b.broker, cfg.Kind), cmp.Or(b.amqpURL, cfg.AMQP.URL)
	if b.kafkaBrokers != "" {
		cfg.Kafka.Brokers = nil
		for _, a := range strings.Split(b.kafkaBrokers, ",") {
			if a = strings.TrimSpace(a); a != "" {
				cfg.Kafka.Brokers = append(cfg.Kafka.Brokers, a)
			}
		}
	}
	b.brokerSecrets = append(b.brokerSecrets, brokerSecrets(cfg)...)
	return cfg, cfg.Validate()
}

// browseConfig is brokerConfig as cli browses it (Config.BrowseAs).
func (b *brokerFlags) browseConfig(cli Config) (brokers.Config, error) {
	cfg, err := b.brokerConfig()
	if err != nil {
		return cfg, err
	}
	if cfg, err = cli.browsed(cfg); err != nil {
		return cfg, b.redactErr(err, func(s string) string { return s })
	}
	b.brokerSecrets = append(b.brokerSecrets, brokerSecrets(cfg)...)
	return cfg, nil
}

// brokerSecrets are cfg's passwords (Scrub skips an empty one).
func brokerSecrets(cfg brokers.Config) []string {
	return slices.Concat(config.Passwords(cfg.AMQP.URL), config.Passwords(cfg.NATS.URL),
		[]string{cfg.Kafka.SASL.Password, cfg.NATS.Password, cfg.NATS.Token})
}

func (b *brokerFlags) redactErr(err error, redact func(string) string) error {
	return &redactedError{msg: config.Scrub(redact(err.Error()), b.brokerSecrets...), err: err}
}

// target names the database without credentials.
func target(cfg *pgxpool.Config) string {
	cc := cfg.ConnConfig
	return fmt.Sprintf("%s@%s:%d/%s", cc.User, cc.Host, cc.Port, cc.Database)
}

func tableName(st *store.Store) string {
	return st.Config().Schema + "." + st.Config().ClaimsTable
}

// durationValue is a flag of Go durations and days ("30d", "1d12h"):
// retention windows are thought of in days. It prints what was typed: "3d"
// read back as "72h0m0s" looks like another value.
type durationValue struct {
	d     time.Duration
	typed string
}

func (v *durationValue) String() string {
	if v.typed != "" {
		return v.typed
	}
	return opfmt.FormatDuration(v.d)
}

func (v *durationValue) Set(s string) error {
	d, err := opfmt.ParseDuration(s)
	if err != nil {
		return err
	}
	v.d, v.typed = d, strings.TrimSpace(s)
	return nil
}

// retentionFlags are a retention, its minimum and the --force that
// accepts one below it (cleanup's --window, partitions' --retention).
type retentionFlags struct {
	name, minName string
	value, min    durationValue
}

func newRetentionFlags(name, minName string) *retentionFlags {
	return &retentionFlags{name: name, minName: minName,
		value: durationValue{d: pg.DefaultRetention}, min: durationValue{d: pg.DefaultMinRetention}}
}

func (r *retentionFlags) register(fs *flag.FlagSet, cfg *store.RetentionConfig, help, minHelp, noun string) {
	fs.Var(&r.value, r.name, help)
	fs.Var(&r.min, r.minName, minHelp)
	fs.BoolVar(&cfg.Force, "force", false, fmt.Sprintf("accept a %s below --%s: duplicates older than it will be applied again", noun, r.minName))
}

// apply puts the retention into cfg and checks cfg, refusing one below
// its minimum in the flags' terms first (the store's error speaks of
// fields).
func (r *retentionFlags) apply(cmd string, cfg *store.RetentionConfig) error {
	cfg.Retention, cfg.MinRetention = r.value.d, r.min.d
	if r.value.d < r.min.d && !cfg.Force {
		return &usageError{msg: fmt.Sprintf(
			"%s: --%s %s is below --%s %s: claims younger than a replay can arrive would be deleted, and those duplicates applied again; pass --force if you mean it",
			cmd, r.name, &r.value, r.minName, &r.min)}
	}
	return cfg.Validate()
}

func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// printf, printlnTo and printTo ignore a failed write (a closed pipe): no
// better place to report it than the exit status the command has.
func printf(w io.Writer, format string, a ...any) { _, _ = fmt.Fprintf(w, format, a...) }

func printlnTo(w io.Writer, a ...any) { _, _ = fmt.Fprintln(w, a...) }

func printTo(w io.Writer, a ...any) { _, _ = fmt.Fprint(w, a...) }
