package claimtxcli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/console"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store"
)

// `claimtx console`: flags, the refusal of unsafe listen settings and the
// HTTP server of internal/console.

const defaultConsoleListen = "127.0.0.1:7070"

func init() {
	synopses["console"] = `Serve the web console: an overview of every consumer of the claim table (applied per
minute, hour and day, poisoned, oldest and newest claim, retention against the broker's replay
horizon, partitions), the look-up of a key (claim, transaction, outbox rows, poison memo) and,
for consumers given with --consumer-config, their dead letters: classified, previewed and
replayed.

It listens on 127.0.0.1:7070 by default. A listen address that is not loopback needs an
access token, from CLAIMTX_CONSOLE_TOKEN or --token-file (never a flag value: other users see
a process's arguments); it is refused without one. With a token, the browser signs in once
(a session cookie) and scripts send "Authorization: Bearer TOKEN". --read-only removes the
replay and the clearing of poison memos. docs/console.md describes every page and the
security model.

Examples:
  claimtx console --consumer-config examples/loyalty/config.example.yaml
  CLAIMTX_CONSOLE_TOKEN=$(cat /run/secrets/console) claimtx console --listen 0.0.0.0:7070 --read-only \
      --consumer-config loyalty.yaml --metrics loyalty=http://loyalty:9090/metrics`
}

func cmdConsole(ctx context.Context, args []string, stdout, _ io.Writer, getenv env, cli Config) error {
	fs, c := newFlags("console", stdout, getenv)
	listen := fs.String("listen", "", "`address` to serve on (env CLAIMTX_CONSOLE_LISTEN; default "+defaultConsoleListen+")")
	tokenFile := fs.String("token-file", "", "`file` holding the access token (or env CLAIMTX_CONSOLE_TOKEN); required to listen on a non-loopback address")
	readOnly := fs.Bool("read-only", false, "no state-changing action: no replay, no clearing of poison memos")
	outbox := fs.String("outbox-table", "", "outbox `table` (env CLAIMTX_OUTBOX_TABLE; default outbox, or the consumer configuration's)")
	rate := fs.Float64("replay-rate", 0, "replay at most this many dead letters per second (0: no limit)")
	var configs, metrics []string
	fs.Func("consumer-config", "a consumer's configuration `file` (consumer.LoadConfig's YAML; repeatable): enables its dead letters and paste-a-message", appendTo(&configs))
	fs.Func("metrics", "`NAME=URL` of a consumer's Prometheus endpoint, for its duplicate and poisoned totals (repeatable)", appendTo(&metrics))
	if err := c.parse(fs, args); err != nil {
		return err
	}
	*listen = cmp.Or(*listen, getenv("CLAIMTX_CONSOLE_LISTEN"), defaultConsoleListen)
	token, err := consoleToken(*tokenFile, getenv)
	if err != nil {
		return err
	}
	if err := checkListen(*listen, token); err != nil {
		return err
	}
	metricURLs := map[string]string{}
	for _, m := range metrics {
		name, u, ok := strings.Cut(m, "=")
		if !ok || name == "" {
			return &usageError{msg: fmt.Sprintf("console: --metrics %q: want NAME=URL, e.g. loyalty=http://127.0.0.1:9090/metrics", m)}
		}
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return &usageError{msg: fmt.Sprintf("console: --metrics %s: %q is not an http(s) URL", name, u)}
		}
		metricURLs[name] = u
	}
	if *rate < 0 {
		return &usageError{msg: "console: --replay-rate must not be negative"}
	}
	cfg := console.Config{Token: token, Listen: *listen, ReadOnly: *readOnly, Metrics: metricURLs, ReplayRate: *rate, Extractors: cli.Extractors}
	var secrets []string
	for i, path := range configs {
		cc, err := consumer.LoadConfig(path)
		if err == nil && cc.Key != "" {
			// Checked now, so the error names the file.
			_, err = cli.Extractors.ParseKey(cc.Key)
		}
		if err != nil {
			return fmt.Errorf("console: --consumer-config %s: %w", path, err)
		}
		cc.Store.Schema = cmp.Or(cc.Store.Schema, pg.DefaultSchema)
		cc.Store.ClaimsTable = cmp.Or(cc.Store.ClaimsTable, pg.DefaultClaimsTable)
		cc.Store.OutboxTable = cmp.Or(cc.Store.OutboxTable, pg.DefaultOutboxTable)
		if i == 0 {
			c.databaseURL = cmp.Or(c.databaseURL, getenv("DATABASE_URL"), cc.DatabaseURL)
			c.schema = cmp.Or(c.schema, getenv("CLAIMTX_SCHEMA"), cc.Store.Schema)
			c.table = cmp.Or(c.table, getenv("CLAIMTX_TABLE"), cc.Store.ClaimsTable)
			*outbox = cmp.Or(*outbox, getenv("CLAIMTX_OUTBOX_TABLE"), cc.Store.OutboxTable)
		}
		if err := sameClaimTable(path, cc, c.databaseURL, c.schemaName(), c.tableName()); err != nil {
			return err
		}
		secrets = append(secrets, brokerSecrets(cc.Broker)...)
		if cc.Broker, err = cli.browsed(cc.Broker); err != nil {
			return fmt.Errorf("console: --consumer-config %s: %w", path, err)
		}
		// The broker's URL, too: a page shows no connection string.
		secrets = slices.Concat(secrets, []string{cc.Broker.AMQP.URL}, brokerSecrets(cc.Broker), dbSecrets(cc.DatabaseURL))
		cfg.Consumers = append(cfg.Consumers, console.Consumer{
			Name: cc.Name, Topic: cc.Topic, PoisonTopic: cc.PoisonTopic, Key: cc.Key,
			KeyPolicy: cc.Claim.KeyPolicy, Retention: cc.Retention, Broker: cc.Broker,
		})
	}
	*outbox = cmp.Or(*outbox, getenv("CLAIMTX_OUTBOX_TABLE"), pg.DefaultOutboxTable)
	c.fromEnv()
	secrets = append(secrets, dbSecrets(c.databaseURL)...)
	pool, err := c.consolePool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg.Pool, cfg.Schema, cfg.ClaimsTable, cfg.OutboxTable, cfg.Secrets = pool, c.schemaName(), c.tableName(), *outbox, secrets
	con, err := console.New(cfg)
	if err != nil {
		return err
	}
	defer con.Close()

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	srv := &http.Server{
		Handler:           con,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      2 * time.Minute, // a page waits for its queries and the broker
		IdleTimeout:       2 * time.Minute,
	}
	mode := "loopback only, no token"
	if token != "" {
		mode = "token required"
	}
	if *readOnly {
		mode += ", read-only"
	}
	printf(stdout, "console listening on http://%s (%s)\n", ln.Addr(), mode)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("console: %w", err)
	case <-ctx.Done():
	}
	// Pages in flight get a moment; Close stops the replay jobs between
	// two batches.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	con.Close()
	printlnTo(stdout, "console stopped")
	return nil
}

func consoleToken(file string, getenv env) (string, error) {
	env := getenv("CLAIMTX_CONSOLE_TOKEN")
	if file != "" && env != "" {
		return "", &usageError{msg: "console: CLAIMTX_CONSOLE_TOKEN and --token-file are both set: keep one"}
	}
	token := env
	if file != "" {
		b, err := os.ReadFile(file) //nolint:gosec // the operator names the token file
		if err != nil {
			return "", &usageError{msg: fmt.Sprintf("console: --token-file: %v", err)}
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return "", &usageError{msg: fmt.Sprintf("console: --token-file %s is empty", file)}
		}
	}
	if token != "" && len(token) < console.MinTokenBytes {
		return "", &usageError{msg: fmt.Sprintf("console: the access token is %d bytes; use at least %d random bytes, e.g. `openssl rand -hex 32`", len(token), console.MinTokenBytes)}
	}
	return token, nil
}

func checkListen(listen, token string) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return &usageError{msg: fmt.Sprintf("console: --listen %q: want HOST:PORT, e.g. %s", listen, defaultConsoleListen)}
	}
	if token != "" || loopback(host) {
		return nil
	}
	return &usageError{msg: fmt.Sprintf("console: refusing to listen on %s without an access token: other hosts could reach it. "+
		"Set CLAIMTX_CONSOLE_TOKEN (or --token-file FILE) to a random secret of at least %d bytes, or listen on a loopback address (--listen %s)",
		listen, console.MinTokenBytes, defaultConsoleListen)}
}

// loopback: host is reachable from this machine only ("" is every
// interface).
func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func sameClaimTable(path string, cc consumer.Config, dbURL, schema, table string) error {
	if cc.Store.Schema != schema || cc.Store.ClaimsTable != table {
		return &usageError{msg: fmt.Sprintf("console: --consumer-config %s: its claim table is %s.%s, the console's %s.%s: one console serves one claim table; run one console per table",
			path, cc.Store.Schema, cc.Store.ClaimsTable, schema, table)}
	}
	if cc.DatabaseURL == "" || dbURL == "" {
		return nil
	}
	a, errA := pgx.ParseConfig(cc.DatabaseURL)
	b, errB := pgx.ParseConfig(dbURL)
	if errA != nil || errB != nil {
		return nil // connecting reports it
	}
	if a.Host != b.Host || a.Port != b.Port || a.Database != b.Database {
		return &usageError{msg: fmt.Sprintf("console: --consumer-config %s: its database is %s:%d/%s, the console's %s:%d/%s: one console serves one claim table; run one console per database",
			path, a.Host, a.Port, a.Database, b.Host, b.Port, b.Database)}
	}
	return nil
}

func dbSecrets(dsn string) []string {
	if dsn == "" {
		return nil
	}
	return append([]string{dsn}, dbPasswords(dsn)...)
}

func (c *common) consolePool(ctx context.Context) (*pgxpool.Pool, error) {
	cfg := store.Config{Schema: c.schema, ClaimsTable: c.table}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if c.databaseURL == "" {
		return nil, &usageError{msg: "console: no database: set DATABASE_URL, pass --database-url, or give a --consumer-config with database_url"}
	}
	// The overview runs its queries side by side; a replay job holds one.
	st, err := c.open(ctx, 8, "claimtx-console", "console: ")
	if err != nil {
		return nil, err
	}
	if err := c.migrated(ctx, st, "console"); err != nil {
		c.pool.Close()
		return nil, err
	}
	return c.pool, nil
}
