package testenv

// The Postgres side of the suite: a schema or database per test, on the
// server TEST_DATABASE_URL names.

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultURL is used when TEST_DATABASE_URL is not set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL returns TEST_DATABASE_URL, or DefaultURL.
func URL() string { return cmp.Or(os.Getenv("TEST_DATABASE_URL"), DefaultURL) }

// NewSchema creates an empty schema with a random name and drops it (with
// everything in it) when the test ends.
func NewSchema(t testing.TB) string {
	t.Helper()
	schema := randomName("t_")
	if BehindPooler() {
		if err := ensureSchemaRole(context.Background(), schema); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		// Registered first, so it runs after the schema's drop; a role left
		// behind is an empty login: logged, not failed.
		t.Cleanup(func() {
			if err := dropSchemaRole(schema); err != nil {
				t.Logf("testenv: drop role %s: %v", schema, err)
			}
		})
	}
	ident := pgx.Identifier{schema}.Sanitize()
	createDropped(t, "CREATE SCHEMA "+ident, "DROP SCHEMA IF EXISTS "+ident+" CASCADE", 30*time.Second)
	return schema
}

// createDropped runs create, and drop (given dropTimeout) when the test ends.
func createDropped(t testing.TB, create, drop string, dropTimeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	execSQL(ctx, t, create)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), dropTimeout)
		defer cancel()
		execSQL(ctx, t, drop)
	})
}

// randomName is prefix and 12 random hex digits (crypto/rand never fails).
func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func execSQL(ctx context.Context, t testing.TB, sql string) {
	t.Helper()
	if err := onServer(ctx, func(conn *pgx.Conn) error { _, err := conn.Exec(ctx, sql); return err }); err != nil {
		t.Fatalf("testenv: %s: %v", sql, err)
	}
}

// onServer runs f on a connection of its own to URL().
func onServer(ctx context.Context, f func(*pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		return fmt.Errorf("connect %s: %w", redacted(), err)
	}
	defer func() { _ = conn.Close(ctx) }()
	return f(conn)
}

// Pool returns a pool whose connections use schema as their search_path, so
// a test's own tables land in its schema, with at most maxConns connections.
// It is closed when the test ends.
func Pool(t testing.TB, schema string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	pool, err := newPool(context.Background(), schema, maxConns)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newPool is Pool without a test (maxConns 0: pgxpool's default), setting
// search_path by startup parameter, or by the schema's role behind a pooler.
func newPool(ctx context.Context, schema string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", redacted(), err)
	}
	if BehindPooler() {
		if err := ensureSchemaRole(ctx, schema); err != nil {
			return nil, err
		}
		cfg.ConnConfig.User = schema
	} else {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// Setup is NewSchema followed by Pool.
func Setup(t testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	schema := NewSchema(t)
	return Pool(t, schema, maxConns), schema
}

func redacted() string {
	cfg, err := pgx.ParseConfig(URL())
	if err != nil {
		return "TEST_DATABASE_URL (unparsable)"
	}
	return cfg.Host + "/" + cfg.Database
}

// URLWithSearchPath returns URL() with search_path set to schema, for
// processes (a consumer under test) that should create their tables there.
func URLWithSearchPath(schema string) (string, error) {
	if !BehindPooler() {
		return withParam(URL(), "search_path", schema)
	}
	u, err := url.Parse(URL())
	if err != nil {
		return "", err
	}
	if err := ensureSchemaRole(context.Background(), schema); err != nil {
		return "", err
	}
	if p, ok := u.User.Password(); ok {
		u.User = url.UserPassword(schema, p)
	} else {
		u.User = url.User(schema)
	}
	return u.String(), nil
}

// NewDatabase creates an empty database with a random name and returns its
// URL; it is dropped (sessions terminated) when the test ends. Start-up tests
// need it: a fresh schema in a shared database is not the empty database a
// first deploy meets (default schema, public's tables, catalog caches).
func NewDatabase(t testing.TB) string {
	t.Helper()
	name := randomName("t_db_")
	ident := pgx.Identifier{name}.Sanitize()
	// A generous drop: one cancelled half-way leaves an invalid database
	// behind, and a loaded shared server can take a while to drop one.
	createDropped(t, "CREATE DATABASE "+ident, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)", 2*time.Minute)
	u, err := url.Parse(URL())
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", redacted(), err)
	}
	u.Path = "/" + name
	return u.String()
}

// ExamplePool is for runnable examples, which have no testing.T: a pool on
// the test server with a fresh schema's name (Migrate creates it) as its
// search_path, and that name. It panics on error; see DropExample.
func ExamplePool(ctx context.Context) (*pgxpool.Pool, string) {
	schema := randomName("example_")
	pool, err := newPool(ctx, schema, 0)
	if err != nil {
		panic(err)
	}
	return pool, schema
}

// DropExample drops an ExamplePool schema and closes its pool.
func DropExample(pool *pgxpool.Pool, schema string) {
	_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	pool.Close()
	DropSchemaRole(schema)
}

// DropSchemaRole drops the login role standing for schema's search_path
// behind a pooler (ExamplePool, URLWithSearchPath) once the schema is gone;
// elsewhere it does nothing. Errors are dropped: a leftover is an empty login.
func DropSchemaRole(schema string) {
	if BehindPooler() {
		_ = dropSchemaRole(schema)
	}
}

// PgBouncer in transaction pooling mode (.ci/pgbouncer), for the tests that
// prove claimtx keeps no session state (issue 29).

// PoolerEnv names the variable that says TEST_DATABASE_URL is a
// transaction pooler (make test-pgbouncer sets it to 1).
const PoolerEnv = "TEST_BEHIND_POOLER"

// BehindPooler reports whether TEST_DATABASE_URL is a transaction pooler:
// tests that need a real session (a backend to terminate, LISTEN) skip, and
// Pool isolates schemas by role, not by a search_path startup parameter.
func BehindPooler() bool {
	v := os.Getenv(PoolerEnv)
	return v != "" && v != "0" && v != "false"
}

// DirectEnv names the variable holding the Postgres that the pooler of
// PoolerEnv fronts (make test-pgbouncer sets it).
const DirectEnv = "TEST_DIRECT_DATABASE_URL"

// DirectURL is DirectEnv's Postgres, past any pooler, or URL when it is
// not set: for a test's own observer that needs a session (a LISTEN).
func DirectURL() string { return cmp.Or(os.Getenv(DirectEnv), URL()) }

// SkipBehindPooler skips the test when BehindPooler, saying why.
func SkipBehindPooler(t testing.TB, why string) {
	t.Helper()
	if BehindPooler() {
		t.Skipf("behind a transaction pooler (%s=%s): %s", PoolerEnv, os.Getenv(PoolerEnv), why)
	}
}

// StartPgBouncer starts a PgBouncer of the test's own on a free loopback
// port in front of upstreamHost:upstreamPort until the test ends, installed
// if missing (as root; else SkipOrFail), and returns its PoolerURL
// (database test, user postgres).
func StartPgBouncer(t testing.TB, upstreamHost string, upstreamPort int) string {
	t.Helper()
	script, err := ciScript("pgbouncer")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, script, "install").CombinedOutput(); err != nil { //nolint:gosec // the repository's own script
		SkipOrFail(t, "pgbouncer not installed and cannot be: %v: %s", err, out)
		return ""
	}
	dir, err := os.MkdirTemp("", "claimtx-pgbouncer-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	// The script chowns dir to postgres; the cleanup removes it as us.
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var port int
	// The free port can be taken before pgbouncer binds it: try three.
	for attempt := 0; ; attempt++ {
		port = freePort(t)
		cmd := exec.CommandContext(ctx, script, "start", dir, fmt.Sprint(port), upstreamHost, fmt.Sprint(upstreamPort)) //nolint:gosec // the repository's own script
		// The parallel suite starts many in front of the shared server
		// (max_connections 100): each holds at most 8 server connections
		// whatever the database, and its clients queue for them.
		cmd.Env = append(os.Environ(), "PGBOUNCER_POOL_SIZE=8", "PGBOUNCER_MAX_DB_CONNECTIONS=8", "PGBOUNCER_MAX_USER_CONNECTIONS=8")
		out, err := cmd.CombinedOutput()
		if err == nil {
			break
		}
		if attempt == 2 {
			t.Fatalf("testenv: start pgbouncer: %v: %s", err, out)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(ctx, script, "stop", dir).CombinedOutput(); err != nil { //nolint:gosec // the repository's own script
			t.Errorf("testenv: stop pgbouncer: %v: %s", err, out)
		}
	})
	return PoolerURL(fmt.Sprintf("postgres://postgres@127.0.0.1:%d/test?sslmode=disable", port))
}

// ThroughPgBouncer starts a PgBouncer in front of URL's server and returns
// what turns a URL of that server (a NewDatabase) into one through it. A
// suite already behind a pooler skips: its plain tests go through one.
func ThroughPgBouncer(t testing.TB) func(dbURL string) string {
	t.Helper()
	if BehindPooler() {
		t.Skip("TEST_DATABASE_URL is a pooler already: the test's direct twin runs through it")
	}
	direct, err := pgx.ParseConfig(URL())
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", redacted(), err)
	}
	bouncer, err := url.Parse(StartPgBouncer(t, direct.Host, int(direct.Port)))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return func(dbURL string) string {
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatalf("testenv: parse a database URL: %v", err)
		}
		u.Host = bouncer.Host
		return PoolerURL(u.String())
	}
}

// PoolerURL adds default_query_exec_mode=exec to a Postgres URL: pgx's
// default caches prepared statements per connection, which a transaction
// pooler hands to other clients between transactions.
func PoolerURL(raw string) string {
	if u, err := withParam(raw, "default_query_exec_mode", "exec"); err == nil {
		return u
	}
	return raw
}

// withParam returns raw with the query parameter key set to value.
func withParam(raw, key, value string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// ciScript is the repository's .ci/<name>, found from this file's source
// location: tests run in their package's directory, anywhere in the tree.
func ciScript(name string) (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the testenv source (for .ci/" + name + ")")
	}
	script := filepath.Join(filepath.Dir(file), "..", "..", ".ci", name)
	if _, err := os.Stat(script); err != nil {
		return "", fmt.Errorf("%s script: %w", name, err)
	}
	return script, nil
}

// ensureSchemaRole makes schema's login role (named as the schema) unless
// it exists, with the schema as its search_path. PgBouncer pools server
// connections per (database, user), so such a role gives each of its
// server connections that search_path, which a startup parameter cannot
// (PgBouncer 1.18 refuses it). A superuser, as postgres is in the direct
// runs, so a test keeps the same rights.
func ensureSchemaRole(ctx context.Context, schema string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	role := pgx.Identifier{schema}.Sanitize()
	// One transaction, so a racing caller that finds the role finds its
	// search_path too.
	err := onServer(ctx, func(conn *pgx.Conn) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "CREATE ROLE "+role+" LOGIN SUPERUSER"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "ALTER ROLE "+role+" SET search_path = "+role)
			return err
		})
	})
	// 42710 duplicate_object, 23505 unique_violation: NewSchema or a racing
	// caller made it.
	if err != nil && !strings.Contains(err.Error(), "42710") && !strings.Contains(err.Error(), "23505") {
		return fmt.Errorf("role for schema %s: %w", schema, err)
	}
	return nil
}

// dropSchemaRole drops schema's role and what it still owns, one statement
// at a time (behind a pooler each goes in the extended protocol, one command
// per statement); PgBouncer's idle connections do not hold it up, and a
// role already gone is no error.
func dropSchemaRole(schema string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := pgx.Identifier{schema}.Sanitize()
	return onServer(ctx, func(conn *pgx.Conn) error {
		for _, sql := range []string{"DROP OWNED BY " + r + " CASCADE", "DROP ROLE " + r} {
			if _, err := conn.Exec(ctx, sql); err != nil {
				if strings.Contains(err.Error(), "42704") { // undefined_object
					return nil
				}
				return err
			}
		}
		return nil
	})
}

// MaxGroup is middleware.Claim.MaxGroup for the suites' claims:
// CLAIM_MAX_GROUP, as a user sets it (make test-per-message runs them with
// 1), or 0, the default.
func MaxGroup() int {
	n, _ := strconv.Atoi(os.Getenv("CLAIM_MAX_GROUP"))
	return n
}
