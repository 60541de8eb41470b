package testenv

// PgBouncer in transaction pooling mode in front of a Postgres, for the
// tests that prove claimtx keeps no session state (issue 29). The
// instance is the repository's .ci/pgbouncer script's, so tests, make
// targets and CI run the same configuration.

import (
	"context"
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
)

// PoolerEnv names the variable that says TEST_DATABASE_URL is a
// transaction pooler (make test-pgbouncer sets it to 1).
const PoolerEnv = "TEST_BEHIND_POOLER"

// BehindPooler reports whether TEST_DATABASE_URL points at a transaction
// pooler: tests that need a real session (a known backend to terminate,
// LISTEN) skip then, and Pool isolates schemas by role instead of by a
// search_path startup parameter, which PgBouncer 1.18 refuses.
func BehindPooler() bool {
	v := os.Getenv(PoolerEnv)
	return v != "" && v != "0" && v != "false"
}

// DirectEnv names the variable holding the Postgres that the pooler of
// PoolerEnv fronts (make test-pgbouncer sets it).
const DirectEnv = "TEST_DIRECT_DATABASE_URL"

// DirectURL is a URL that reaches Postgres itself, past any pooler: for a
// test's own observer that needs a session (a LISTEN), while what it
// observes goes through URL. It is TEST_DIRECT_DATABASE_URL, or URL when
// that is not set.
func DirectURL() string {
	if u := os.Getenv(DirectEnv); u != "" {
		return u
	}
	return URL()
}

// SkipBehindPooler skips the test when BehindPooler, saying why.
func SkipBehindPooler(t testing.TB, why string) {
	t.Helper()
	if BehindPooler() {
		t.Skipf("behind a transaction pooler (%s=%s): %s", PoolerEnv, os.Getenv(PoolerEnv), why)
	}
}

// StartPgBouncer starts a PgBouncer of the test's own (transaction
// pooling, .ci/pgbouncer) on a free loopback port in front of
// upstreamHost:upstreamPort, and stops it when the test ends. Where
// pgbouncer is missing it is installed (as root); where it cannot be, the
// test skips (fails under CI). The URL is what a pgx user behind PgBouncer
// writes: database test, user postgres, default_query_exec_mode=exec
// (1.18 keeps no prepared statements across transactions).
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
		// The parallel suite starts many at once in front of the shared
		// server (max_connections 100), the cold-start races a database a
		// round: each holds at most 8 server connections whatever the
		// database, and its clients queue for them.
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

// ThroughPgBouncer starts a PgBouncer in front of the server URL names
// and returns what turns a URL of that server (a database NewDatabase
// made, say) into the same database through it. A suite already run
// through a pooler (BehindPooler) skips: its plain tests go through one.
func ThroughPgBouncer(t testing.TB) func(dbURL string) string {
	t.Helper()
	if BehindPooler() {
		t.Skip("TEST_DATABASE_URL is a pooler already: the test's direct twin runs through it")
	}
	direct, err := url.Parse(URL())
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", redacted(), err)
	}
	port, err := strconv.Atoi(direct.Port())
	if err != nil {
		t.Fatalf("testenv: port of %s: %v", redacted(), err)
	}
	bouncer, err := url.Parse(StartPgBouncer(t, direct.Hostname(), port))
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
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	q := u.Query()
	q.Set("default_query_exec_mode", "exec")
	u.RawQuery = q.Encode()
	return u.String()
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

// schemaRole is the login role a schema's connections use behind a
// pooler. PgBouncer pools server connections per (database, user), so a
// role whose search_path is the schema (ALTER ROLE … SET) gives every
// server connection it gets exactly that search_path, which a startup
// parameter cannot (PgBouncer 1.18 refuses search_path there, and would
// not keep it per client anyway). The role is a superuser, as postgres is
// in the direct runs: a test keeps the same rights, and another test's
// tables stay off its search_path as they do directly.
func schemaRole(schema string) string { return schema }

// ensureSchemaRole creates schema's role if it does not exist yet.
func ensureSchemaRole(ctx context.Context, schema string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	role := pgx.Identifier{schemaRole(schema)}.Sanitize()
	// A DO block, not CREATE ROLE alone: ExamplePool and URLWithSearchPath
	// may be asked for a schema whose role NewSchema already made. The
	// literal is quoted by hand: a DO body takes no parameters, and the
	// names are ours (t_/example_ and hex).
	lit := "'" + strings.ReplaceAll(schema, "'", "''") + "'"
	sql := fmt.Sprintf(`DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = %s) THEN
    CREATE ROLE %s LOGIN SUPERUSER;
  END IF;
END $$;
ALTER ROLE %s SET search_path = %s`, lit, role, role, role)
	err := onServer(ctx, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, sql)
		if err != nil && strings.Contains(err.Error(), "42710") {
			// duplicate_object: two callers raced on the IF NOT EXISTS.
			_, err = conn.Exec(ctx, sql)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("role for schema %s: %w", schema, err)
	}
	return nil
}

// dropSchemaRole drops schema's role once the schema is gone, with what
// it still owns elsewhere in the database (a test's own extra schema), one
// statement at a time: the URL behind a pooler sends each in the extended
// protocol, which takes one command per statement. Idle server connections
// PgBouncer keeps for the role do not hold the drop up; a role already
// gone is no error.
func dropSchemaRole(schema string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := pgx.Identifier{schemaRole(schema)}.Sanitize()
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
