package testenv

// PgBouncer in transaction pooling mode, the repository's .ci/pgbouncer as
// make and CI run it, for the tests that prove claimtx keeps no session
// state (issue 29).

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

// DirectURL is DirectEnv's Postgres, past any pooler, or URL when it is
// not set: for a test's own observer that needs a session (a LISTEN).
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

// StartPgBouncer starts a PgBouncer of the test's own on a free loopback
// port in front of upstreamHost:upstreamPort until the test ends,
// installing it where it is missing (as root; else the test skips, fails
// under CI), and returns its URL: database test, user postgres, PoolerURL.
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

// schemaRole is the login role a schema's connections use behind a
// pooler. PgBouncer pools server connections per (database, user), so a
// role whose search_path is the schema (ALTER ROLE … SET) gives each of
// its server connections that search_path, which a startup parameter
// cannot (PgBouncer 1.18 refuses it). A superuser, as postgres is in the
// direct runs, so a test keeps the same rights.
func schemaRole(schema string) string { return schema }

// ensureSchemaRole creates schema's role if it does not exist yet.
func ensureSchemaRole(ctx context.Context, schema string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	role := pgx.Identifier{schemaRole(schema)}.Sanitize()
	// A DO block, not CREATE ROLE alone: NewSchema may have made the role.
	// The literal is quoted by hand: a DO body takes no parameters, and the
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

// dropSchemaRole drops schema's role once the schema is gone, with what it
// still owns (a test's own extra schema), one statement at a time: the URL
// behind a pooler sends each in the extended protocol, one command per
// statement. PgBouncer's idle server connections of the role do not hold
// the drop up; a role already gone is no error.
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
