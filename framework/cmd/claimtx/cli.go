package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/migrate"
	"github.com/claimtx/claimtx/internal/opfmt"
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

// runEnv is run with an explicit context and environment.
func runEnv(ctx context.Context, args []string, stdout, stderr io.Writer, getenv env) int {
	if len(args) == 0 {
		printTo(stderr, usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	var err error
	switch cmd {
	case "help", "-h", "--help":
		printTo(stdout, usage)
		return exitOK
	case "migrate":
		err = cmdMigrate(ctx, rest, stdout, getenv)
	case "cleanup":
		err = cmdCleanup(ctx, rest, stdout, getenv)
	case "partitions":
		err = cmdPartitions(ctx, rest, stdout, getenv)
	case "stats":
		err = cmdStats(ctx, rest, stdout, getenv)
	case "dlq":
		err = cmdDLQ(ctx, rest, stdout, stderr, getenv)
	case "keys":
		err = cmdKeys(ctx, rest, stdout, getenv)
	case "unpoison":
		err = cmdUnpoison(ctx, rest, stdout, getenv)
	case "explain":
		err = cmdExplain(ctx, rest, stdout, getenv)
	case "console":
		err = cmdConsole(ctx, rest, stdout, getenv)
	default:
		printf(stderr, "claimtx: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
	return report(err, stderr)
}

// report prints err (already redacted by the command) and maps it to an
// exit status.
func report(err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
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

// oncePrefixed puts "claimtx: " in front of msg exactly once. The store's
// errors carry that prefix themselves (they are read in application logs,
// where it says which library spoke); wrapped by the CLI it would repeat,
// once per layer.
func oncePrefixed(msg string) string {
	for {
		trimmed := strings.ReplaceAll(strings.TrimPrefix(msg, "claimtx: "), ": claimtx: ", ": ")
		if trimmed == msg {
			return "claimtx: " + msg
		}
		msg = trimmed
	}
}

// common holds the connection flags every command takes, and the pool once
// connected.
type common struct {
	databaseURL, schema, table string
	getenv                     env
	stdout                     io.Writer
	pool                       *pgxpool.Pool
}

// newFlags returns the flag set of one (sub)command, name being what
// follows "claimtx", with the connection flags. Package flag neither prints
// nor exits: it would print the usage around every error, and the error
// again after it; parse and printHelp do the printing.
func newFlags(name string, stdout io.Writer, getenv env) (*flag.FlagSet, *common) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	c := &common{getenv: getenv, stdout: stdout}
	// The environment is read after parsing, not used as flag defaults:
	// -h and flag errors print defaults, and DATABASE_URL holds a password.
	fs.StringVar(&c.databaseURL, "database-url", "", "Postgres connection string (env DATABASE_URL)")
	fs.StringVar(&c.schema, "schema", "", "claimtx schema (env CLAIMTX_SCHEMA; default claimtx)")
	fs.StringVar(&c.table, "table", "", "claim table (env CLAIMTX_TABLE; default processed_messages)")
	return fs, c
}

// fromEnv fills the connection settings not given as flags.
func (c *common) fromEnv() {
	c.databaseURL = cmp.Or(c.databaseURL, c.getenv("DATABASE_URL"))
	c.schema = cmp.Or(c.schema, c.getenv("CLAIMTX_SCHEMA"))
	c.table = cmp.Or(c.table, c.getenv("CLAIMTX_TABLE"))
}

// parse parses args and refuses positional leftovers. Help asked for (-h)
// goes to stdout, so it can be paged; a bad flag is one line and a pointer
// to the help, not the whole help around the error.
func (c *common) parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(c.stdout, fs)
			return err
		}
		return &usageError{msg: fmt.Sprintf("%s: %v\nrun `claimtx %s -h` for its flags", fs.Name(), err, fs.Name())}
	}
	if fs.NArg() > 0 {
		return &usageError{msg: fmt.Sprintf("%s: unexpected argument %q\nrun `claimtx %s -h` for its flags", fs.Name(), fs.Arg(0), fs.Name())}
	}
	return nil
}

// synopses are the one-line descriptions of the commands' help.
var synopses = map[string]string{
	"migrate":                 "Create or upgrade claimtx's schema; safe to run on every host at deploy.",
	"cleanup":                 "Delete claims older than the retention window, in batches. Interrupt it to stop after the current batch; run it again to resume.",
	"stats":                   "Claims per consumer, table and index size; with --topic and --retention, the claims' retention against the broker's replay horizon.",
	"partitions list":         "List the partitions of a partitioned claim table.",
	"partitions enable":       "Convert the claim table to event-day partitions (existing claims are kept as one legacy partition).",
	"partitions create-ahead": "Create missing day partitions through today + --ahead days (UTC).",
	"partitions drop-expired": "Drop day partitions past the retention window.",
}

// printHelp prints a command's usage and its flags. It is the only place
// defaults are printed: a flag's help text never repeats its default.
func printHelp(w io.Writer, fs *flag.FlagSet) {
	printf(w, "Usage: claimtx %s [flags]\n\n%s\n\nFlags:\n", fs.Name(), synopses[fs.Name()])
	fs.VisitAll(func(f *flag.Flag) {
		arg, text := flag.UnquoteUsage(f)
		switch f.Value.(type) {
		case *durationValue:
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

// connect validates the names, opens a small pool and returns the store
// and a close function. Errors never contain the password.
func (c *common) connect(ctx context.Context) (*store.Store, func(), error) {
	c.fromEnv()
	cfg := store.Config{Schema: c.schema, ClaimsTable: c.table}
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	if c.databaseURL == "" {
		return nil, nil, &usageError{msg: "no database: set DATABASE_URL or pass --database-url"}
	}
	pcfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return nil, nil, &usageError{msg: c.redact(fmt.Sprintf("invalid database URL: %v", err))}
	}
	pcfg.MaxConns = 2 // a leader connection and one for everything else
	pcfg.ConnConfig.RuntimeParams["application_name"] = "claimtx-cli"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, errors.New(c.redact(fmt.Sprintf("connect: %v", err)))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, nil, errors.New(c.redact(fmt.Sprintf("connect to %s: %v", target(pcfg), err)))
	}
	st, err := store.New(pool, cfg)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	c.pool = pool
	return st, pool.Close, nil
}

// fail wraps a command's error, removing the password from its text while
// keeping the sentinel errors matchable. A missing claim table is named,
// with the schema when that is what is missing, and the CLI's remedy
// (the store's own text advises the Go API).
func (c *common) fail(ctx context.Context, what string, err error) error {
	var ce *framework.ConfigError
	if errors.As(err, &ce) {
		return err
	}
	// The store's texts for these name neither the table nor a command.
	name := c.schemaName() + "." + c.tableName()
	switch {
	case errors.Is(err, store.ErrNoClaimTable):
		return &redactedError{msg: c.redact(what + ": " + c.missingTable(ctx)), err: err}
	case errors.Is(err, store.ErrNotPartitioned):
		return &redactedError{msg: c.redact(fmt.Sprintf("%s: claim table %s is not partitioned: run `claimtx partitions enable` first, or keep it plain and use `claimtx cleanup`", what, name)), err: err}
	case errors.Is(err, store.ErrPartitioned):
		return &redactedError{msg: c.redact(fmt.Sprintf("%s: claim table %s is partitioned: retention drops whole day partitions, not rows; use `claimtx partitions drop-expired`", what, name)), err: err}
	}
	return &redactedError{msg: c.redact(what + ": " + err.Error()), err: err}
}

// missingTable says which of schema and claim table is missing.
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

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

var keywordPassword = regexp.MustCompile(`password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)`)

// redact removes every spelling of the connection string's password from
// s. pgx already redacts its own parse errors; this is the second belt,
// for every message the CLI prints.
func (c *common) redact(s string) string {
	var secrets []string
	if u, err := url.Parse(c.databaseURL); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok {
			secrets = append(secrets, p, url.QueryEscape(p), url.PathEscape(p))
		}
		if p := u.Query().Get("password"); p != "" {
			secrets = append(secrets, p, url.QueryEscape(p))
		}
	}
	for _, m := range keywordPassword.FindAllStringSubmatch(c.databaseURL, -1) {
		secrets = append(secrets, strings.Trim(m[1], "'"), m[1])
	}
	if cfg, err := pgx.ParseConfig(c.databaseURL); err == nil && cfg.Password != "" {
		secrets = append(secrets, cfg.Password)
	}
	for _, p := range secrets {
		if len(p) >= 1 {
			s = strings.ReplaceAll(s, p, "xxxxx")
		}
	}
	return s
}

// target names the database without credentials.
func target(cfg *pgxpool.Config) string {
	cc := cfg.ConnConfig
	return fmt.Sprintf("%s@%s:%d/%s", cc.User, cc.Host, cc.Port, cc.Database)
}

func tableName(st *store.Store) string {
	return st.Config().Schema + "." + st.Config().ClaimsTable
}

func cmdMigrate(ctx context.Context, args []string, stdout io.Writer, getenv env) error {
	fs, c := newFlags("migrate", stdout, getenv)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	st, closePool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closePool()
	before, err := st.Version(ctx)
	if err != nil {
		return c.fail(ctx, "migrate", err)
	}
	// Migrate runs even when up to date: it is the one that knows.
	if err := st.Migrate(ctx); err != nil {
		return c.fail(ctx, "migrate", err)
	}
	if before == migrate.Latest() {
		printf(stdout, "schema %s is already at version %d, the latest; nothing to do\n", st.Config().Schema, before)
		return nil
	}
	printf(stdout, "migrated schema %s to version %d (was %d)\n", st.Config().Schema, migrate.Latest(), before)
	return nil
}

func cmdCleanup(ctx context.Context, args []string, stdout io.Writer, getenv env) error {
	fs, c := newFlags("cleanup", stdout, getenv)
	var cfg store.RetentionConfig
	window := durationValue{d: pg.DefaultRetention}
	minWindow := durationValue{d: pg.DefaultMinRetention}
	fs.Var(&window, "window", "keep claims processed within this window")
	fs.Var(&minWindow, "min-window", "refuse windows below this unless --force")
	fs.BoolVar(&cfg.Force, "force", false, "accept a window below --min-window: duplicates older than it will be applied again")
	fs.IntVar(&cfg.BatchSize, "batch-size", pg.DefaultBatchSize, "rows in the first batch; later batches adapt")
	// 0 lets the store derive these from --batch-size, so the help states
	// the default in words, not as a flag default.
	fs.IntVar(&cfg.MinBatchSize, "min-batch-size", 0, fmt.Sprintf("smallest adaptive batch (default %d, or --batch-size if smaller)", pg.DefaultMinBatchSize))
	fs.IntVar(&cfg.MaxBatchSize, "max-batch-size", 0, fmt.Sprintf("largest adaptive batch (default %d, or --batch-size if larger)", pg.DefaultMaxBatchSize))
	fs.DurationVar(&cfg.TargetBatchDuration, "target-batch-duration", pg.DefaultTargetBatchDuration, "adapt batch sizes toward this duration")
	fs.DurationVar(&cfg.Pause, "pause", pg.DefaultBatchPause, "pause between batches (negative: none)")
	fs.DurationVar(&cfg.BatchTimeout, "batch-timeout", pg.DefaultBatchTimeout, "statement timeout of one batch")
	fs.BoolVar(&cfg.DryRun, "dry-run", false, "count what would be deleted, delete nothing")
	fs.BoolVar(&cfg.Vacuum, "vacuum", false, "VACUUM (ANALYZE) the table afterwards")
	mode := fs.String("progress", "auto", "progress display: auto (a bar on a terminal, log lines otherwise), bar, log or none")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	cfg.Retention, cfg.MinRetention = window.d, minWindow.d
	switch *mode {
	case "auto":
		*mode = "log"
		if isTerminal(stdout) {
			*mode = "bar"
		}
	case "bar", "log", "none":
	default:
		return &usageError{msg: fmt.Sprintf("cleanup: --progress %q: want auto, bar, log or none", *mode)}
	}
	if err := belowMinimum("cleanup", "window", &window, "min-window", &minWindow, cfg.Force); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	st, closePool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closePool()

	if cfg.DryRun {
		res, err := st.Cleanup(ctx, cfg)
		if err != nil {
			return c.fail(ctx, "cleanup", err)
		}
		oldest := "none"
		if !res.Oldest.IsZero() {
			oldest = res.Oldest.UTC().Format(time.RFC3339)
		}
		printf(stdout, "dry run: %d claims in %s processed before %s would be deleted (oldest %s)\n",
			res.WouldDelete, tableName(st), res.Horizon.UTC().Format(time.RFC3339), oldest)
		if res.Memos > 0 {
			printf(stdout, "dry run: %d poison memos last poisoned before then would be deleted\n", res.Memos)
		}
		return nil
	}
	pp := &progressPrinter{w: stdout, mode: *mode, now: time.Now}
	cfg.OnProgress = func(pr store.CleanupProgress) {
		if pr.Batch == 0 && pp.mode != "none" {
			pp.total, pp.counted = c.countExpired(ctx, st, pr.Horizon)
		}
		pp.update(pr)
	}
	res, err := st.Cleanup(ctx, cfg)
	pp.finish()
	if errors.Is(err, store.ErrNotLeader) {
		printf(stdout, "not leader: another cleaner holds the retention lock on %s; nothing done\n", tableName(st))
		return nil
	}
	summary := fmt.Sprintf("%d claims processed before %s deleted from %s in %d batches, %s (%s claims/s)",
		res.Deleted, res.Horizon.UTC().Format(time.RFC3339), tableName(st), res.Batches, res.Duration.Round(time.Millisecond), formatRate(res.Deleted, res.Duration))
	if err != nil {
		if ctx.Err() != nil {
			printlnTo(stdout, "interrupted:", summary+"; run again to resume")
		}
		return c.fail(ctx, "cleanup", err)
	}
	if res.Memos > 0 {
		summary += fmt.Sprintf("; %d poison memos deleted", res.Memos)
	}
	if res.Vacuumed {
		summary += ", then vacuumed"
	}
	printlnTo(stdout, summary)
	return nil
}

// countBudget bounds the count that gives the cleanup progress its total.
const countBudget = 2 * time.Second

// countExpired counts the claims processed before horizon, exactly, if that
// takes less than countBudget; ok is false otherwise. The planner's
// estimate, which the progress once used, comes from statistics that still
// include the rows an earlier cleanup deleted until the next ANALYZE (2.7x
// too many in the test), and pg_class.reltuples has the same lag; an
// exact count is cheap on the processed_at index for the tables a progress
// total matters least on, and where it is not, no total is better than a
// false one. New claims cannot fall below a horizon in the past, and the
// retention lock keeps other cleaners out, so the count stays right.
func (c *common) countExpired(ctx context.Context, st *store.Store, horizon time.Time) (n int64, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, countBudget+time.Second)
	defer cancel()
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return 0, false
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// A server-side timeout leaves the connection usable for the batches.
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", countBudget.Milliseconds())); err != nil {
		return 0, false
	}
	table := pgx.Identifier{st.Config().Schema, st.Config().ClaimsTable}.Sanitize()
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE processed_at < $1", horizon).Scan(&n); err != nil {
		return 0, false
	}
	return n, true
}

const partitionsUsage = `Usage: claimtx partitions SUBCOMMAND [flags]

  list           list the partitions of a partitioned claim table
  enable         convert the claim table to event-day partitions
  create-ahead   create missing day partitions through today + --ahead
  drop-expired   drop day partitions past the retention window

Run "claimtx partitions SUBCOMMAND -h" for a subcommand's flags.
`

func cmdPartitions(ctx context.Context, args []string, stdout io.Writer, getenv env) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		printTo(stdout, partitionsUsage)
		return flag.ErrHelp
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return &usageError{msg: "partitions: want a subcommand: list, enable, create-ahead or drop-expired\nrun `claimtx partitions -h` for them"}
	}
	sub, rest := args[0], args[1:]
	fs, c := newFlags("partitions "+sub, stdout, getenv)
	var cfg store.RetentionConfig
	retention := durationValue{d: pg.DefaultRetention}
	minRetention := durationValue{d: pg.DefaultMinRetention}
	var prepareOnly bool
	// Each subcommand has only the flags it reads: one it ignores would be
	// accepted silently, and its help would describe another command.
	retentionFlags := func() {
		fs.Var(&retention, "retention", "claim retention by event time")
		fs.Var(&minRetention, "min-retention", "refuse a retention below this unless --force")
		fs.BoolVar(&cfg.Force, "force", false, "accept a retention below --min-retention: duplicates older than it will be applied again")
	}
	aheadFlag := func() {
		fs.IntVar(&cfg.Ahead, "ahead", pg.DefaultPartitionsAhead, "create partitions through today + this many days (UTC)")
	}
	lockWaitFlag := func() {
		fs.DurationVar(&cfg.LockWait, "lock-wait", pg.DefaultPartitionLockWait, "give up (and retry) a lock wait that would block claims after this")
	}
	switch sub {
	case "list":
	case "enable":
		retentionFlags()
		aheadFlag()
		lockWaitFlag()
		fs.BoolVar(&prepareOnly, "prepare-only", false, "only add event_day and build the indexes online, for a rolling switch to event-time claims")
	case "create-ahead":
		retentionFlags()
		aheadFlag()
		lockWaitFlag()
		fs.BoolVar(&cfg.DryRun, "dry-run", false, "list the partitions that would be created, create none")
	case "drop-expired":
		retentionFlags()
		lockWaitFlag()
		fs.BoolVar(&cfg.DryRun, "dry-run", false, "list the partitions that would be dropped, drop none")
	default:
		return &usageError{msg: fmt.Sprintf("partitions: unknown subcommand %q (want list, enable, create-ahead or drop-expired)", sub)}
	}
	if err := c.parse(fs, rest); err != nil {
		return err
	}
	cfg.Retention, cfg.MinRetention = retention.d, minRetention.d
	if err := belowMinimum(fs.Name(), "retention", &retention, "min-retention", &minRetention, cfg.Force); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	st, closePool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closePool()

	notLeader := func(err error) bool {
		if errors.Is(err, store.ErrNotLeader) {
			printf(stdout, "not leader: another process holds the retention lock on %s; nothing done\n", tableName(st))
			return true
		}
		return false
	}
	switch sub {
	case "list":
		parts, err := st.Partitions(ctx)
		if err != nil {
			return c.fail(ctx, "partitions list", err)
		}
		printPartitions(stdout, parts)
	case "enable":
		if prepareOnly {
			err := st.PreparePartitioning(ctx, cfg)
			if notLeader(err) {
				return nil
			}
			if err != nil {
				return c.fail(ctx, "partitions enable --prepare-only", err)
			}
			printf(stdout, "prepared %s: event_day added and indexes built; switch consumers to event-time claims, then run `claimtx partitions enable`\n", tableName(st))
			return nil
		}
		res, err := st.EnablePartitioning(ctx, cfg)
		if notLeader(err) {
			return nil
		}
		if err != nil {
			return c.fail(ctx, "partitions enable", err)
		}
		switch {
		case res.AlreadyPartitioned:
			printf(stdout, "%s is already partitioned; created %d missing day partitions\n", tableName(st), len(res.Created))
		case res.Legacy:
			printf(stdout, "%s is now partitioned by event day: existing claims kept as %s_legacy (event days before %s), %d day partitions created\n",
				tableName(st), st.Config().ClaimsTable, res.Boundary.Format(time.DateOnly), len(res.Created))
		default:
			printf(stdout, "%s is now partitioned by event day: %d day partitions created\n", tableName(st), len(res.Created))
		}
	case "create-ahead":
		created, err := st.CreatePartitionsAhead(ctx, cfg)
		if notLeader(err) {
			return nil
		}
		if err != nil {
			return c.fail(ctx, "partitions create-ahead", err)
		}
		verb := "created"
		if cfg.DryRun {
			verb = "would create"
		}
		printf(stdout, "%s %d partitions\n", verb, len(created))
		printPartitions(stdout, created)
	case "drop-expired":
		start := time.Now()
		dropped, err := st.DropExpiredPartitions(ctx, cfg)
		if notLeader(err) {
			return nil
		}
		if err != nil {
			return c.fail(ctx, "partitions drop-expired", err)
		}
		verb := "dropped"
		if cfg.DryRun {
			verb = "would drop"
		}
		printf(stdout, "%s %d partitions past the %s retention in %s\n", verb, len(dropped), retention.String(), time.Since(start).Round(time.Millisecond))
		printPartitions(stdout, dropped)
	}
	return nil
}

func printPartitions(w io.Writer, parts []store.Partition) {
	if len(parts) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	printlnTo(tw, "NAME\tEVENT DAYS\tROWS (EST.)\tSIZE")
	for _, p := range parts {
		from := "…"
		if !p.From.IsZero() {
			from = p.From.Format(time.DateOnly)
		}
		days := from + " .. " + p.To.AddDate(0, 0, -1).Format(time.DateOnly)
		if p.From.AddDate(0, 0, 1).Equal(p.To) {
			days = from
		}
		if p.DetachPending {
			days += " (detach pending)"
		}
		printf(tw, "%s\t%s\t%d\t%s\n", p.Name, days, p.EstimatedRows, formatBytes(p.Bytes))
	}
	_ = tw.Flush()
}

func cmdStats(ctx context.Context, args []string, stdout io.Writer, getenv env) error {
	fs, c := newFlags("stats", stdout, getenv)
	asJSON := fs.Bool("json", false, "print JSON")
	topic := fs.String("topic", "", "with --retention: compare the claims' retention with the replay horizon of this topic and its poison topic on the broker of BROKER/AMQP_URL/KAFKA_BROKERS")
	poison := fs.String("poison-topic", "", "the poison topic (default TOPIC.poison)")
	var retention durationValue
	fs.Var(&retention, "retention", "with --topic: the consumer's claim retention (consumer.Config.Retention), e.g. 30d")
	var bf brokerFlags
	bf.register(fs)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if (*topic == "") != (retention.d == 0) {
		return &usageError{msg: "stats: --topic and --retention go together"}
	}
	st, closePool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closePool()
	s, err := st.Stats(ctx)
	if err != nil {
		return c.fail(ctx, "stats", err)
	}
	var horizon *horizonReport
	if *topic != "" {
		if *poison == "" {
			*poison = *topic + ".poison"
		}
		bcfg, err := bf.brokerConfig()
		if err != nil {
			return err
		}
		rep, err := replayHorizon(ctx, bcfg, *topic, *poison, retention.d)
		if err != nil {
			return bf.redactErr(fmt.Errorf("stats: replay horizon: %w", err), c.redact)
		}
		horizon = &rep
	}
	var lags []positionLag
	var lagNote string
	if len(s.KafkaPositions) > 0 {
		bcfg, err := bf.brokerConfig()
		if err != nil {
			lagNote = "lag unknown: " + c.redact(err.Error())
			lags = withoutLags(s.KafkaPositions)
		} else {
			lags, lagNote = positionLags(ctx, bcfg, s.KafkaPositions)
			lagNote = c.redact(lagNote)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			store.Stats
			Horizon *horizonReport `json:"retention_horizon,omitempty"`
			Lags    []positionLag  `json:"kafka_position_lags,omitempty"`
		}{s, horizon, lags})
	}
	layout := "plain"
	if s.Partitioned {
		layout = fmt.Sprintf("partitioned by event day, %d partitions", s.Partitions)
	}
	printf(stdout, "claim table %s (%s)\n", tableName(st), layout)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	printlnTo(tw, "CONSUMER\tCLAIMS\tOLDEST\tNEWEST")
	for _, cs := range s.Consumers {
		printf(tw, "%s\t%d\t%s\t%s\n", cs.Consumer, cs.Claims, cs.Oldest.UTC().Format(time.RFC3339), cs.Newest.UTC().Format(time.RFC3339))
	}
	_ = tw.Flush()
	perClaim := "n/a"
	if s.Claims > 0 {
		perClaim = fmt.Sprintf("%.0f B", s.BytesPerClaim)
	}
	printf(stdout, "total %d claims; table %s, indexes %s; ~%s per claim (indexes and free space included)\n",
		s.Claims, formatBytes(s.TableBytes), formatBytes(s.IndexBytes), perClaim)
	printPositions(stdout, lags, lagNote)
	if horizon != nil {
		printf(stdout, "%s\n", horizon)
	}
	return nil
}

// durationValue is a flag accepting Go durations and whole days ("30d",
// "1d12h"), because retention windows are thought of in days. It prints
// what the user typed: "3d" read back as "72h0m0s" looks like another value.
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

// belowMinimum refuses a retention below its minimum unless forced, in the
// flags' own terms. The store checks the same (and is the guard for Go
// callers), but speaks of fields and time.Duration values.
func belowMinimum(cmd, name string, v *durationValue, minName string, minimum *durationValue, force bool) error {
	if v.d >= minimum.d || force {
		return nil
	}
	return &usageError{msg: fmt.Sprintf(
		"%s: --%s %s is below --%s %s: claims younger than a replay can arrive would be deleted, and those duplicates applied again; pass --force if you mean it",
		cmd, name, v, minName, minimum)}
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

func formatRate(n int64, d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return strconv.FormatInt(int64(float64(n)/d.Seconds()), 10)
}

// printf, printlnTo and printTo write the CLI's output. A failed write (a
// closed pipe) cannot be reported anywhere better than the exit status the
// command already has, so it is ignored here, once.
func printf(w io.Writer, format string, a ...any) { _, _ = fmt.Fprintf(w, format, a...) }

func printlnTo(w io.Writer, a ...any) { _, _ = fmt.Fprintln(w, a...) }

func printTo(w io.Writer, a ...any) { _, _ = fmt.Fprint(w, a...) }
