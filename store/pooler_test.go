package store_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
)

// The probe tells a transaction pooler from a direct connection and from
// a pooler in session mode, whichever way the pooler reuses idle servers,
// and on a pool of one connection too (its second connection is not the
// pool's).
func TestBehindTransactionPooler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := directConfig(t)
	transaction := testenv.StartPgBouncer(t, direct.Host, int(direct.Port))
	roundRobin := startBouncer(t, direct, "transaction", true)
	session := startBouncer(t, direct, "session", false)

	for _, c := range []struct {
		name   string
		url    string
		pooled bool
	}{
		{"direct", testenv.DirectURL(), false},
		{"transaction", transaction, true},
		{"transaction, one connection", withParam(transaction, "pool_max_conns", "1"), true},
		{"transaction, round robin", withParam(roundRobin, "default_query_exec_mode", "exec"), true},
		{"session", session, false},
		{"session, one connection", withParam(session, "pool_max_conns", "1"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := poolerStore(t, c.url)
			// Several times: a probe that is right only by the luck of
			// which idle server the pooler picked would flicker.
			for range 5 {
				fresh := poolerStore(t, c.url)
				pooled, err := fresh.BehindTransactionPooler(ctx)
				require.NoError(t, err)
				require.Equal(t, c.pooled, pooled)
			}
			require.NoError(t, st.Migrate(ctx))
			pooled, err := st.BehindTransactionPooler(ctx)
			require.NoError(t, err)
			require.Equal(t, c.pooled, pooled, "Migrate remembers the answer")
		})
	}
}

// Behind a transaction pooler, Migrate refuses the query modes that need a
// session before it runs a statement of its own, with the fix in the
// message; the others migrate.
func TestMigrateRefusesStatementCacheBehindPooler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := directConfig(t)
	bouncer := testenv.StartPgBouncer(t, direct.Host, int(direct.Port))
	session := startBouncer(t, direct, "session", false)

	for _, mode := range []string{"", "cache_statement", "describe_exec"} {
		t.Run("refused "+mode, func(t *testing.T) {
			st := poolerStore(t, withParam(bouncer, "default_query_exec_mode", mode))
			err := st.Migrate(ctx)
			require.ErrorIs(t, err, store.ErrTransactionPooler)
			var ce *framework.ConfigError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, "Pool", ce.Field)
			require.Contains(t, err.Error(), "transaction pooler (PgBouncer pool_mode=transaction?)")
			require.Contains(t, err.Error(), "add default_query_exec_mode=exec to the URL")
			require.NotContains(t, err.Error(), "stmtcache", "the probe runs before any cached statement")
			v, err := st.Version(ctx)
			if err == nil {
				require.Zero(t, v, "nothing was migrated")
			}
		})
	}
	for _, mode := range []string{"exec", "cache_describe", "simple_protocol"} {
		t.Run("accepted "+mode, func(t *testing.T) {
			st := poolerStore(t, withParam(bouncer, "default_query_exec_mode", mode))
			require.NoError(t, st.Migrate(ctx))
			// Enough statements that the pooler hands each one another
			// server than the one that described it.
			for range 20 {
				v, err := st.Version(ctx)
				require.NoError(t, err)
				require.Equal(t, store.SchemaVersion, v)
			}
		})
	}
	t.Run("session mode keeps the statement cache", func(t *testing.T) {
		st := poolerStore(t, withParam(session, "default_query_exec_mode", ""))
		require.NoError(t, st.Migrate(ctx))
	})
}

// directConfig is the upstream a test's own PgBouncer stands in front of:
// the direct server even when the suite itself runs through a pooler.
func directConfig(t *testing.T) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(testenv.DirectURL())
	require.NoError(t, err)
	return cfg
}

// poolerStore is a Store on a schema of the test's own, through url.
func poolerStore(t *testing.T, raw string) *store.Store {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), raw)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	st, err := store.New(pool, store.Config{Schema: testenv.NewSchema(t)})
	require.NoError(t, err)
	return st
}

// withParam sets (or, with an empty value, removes) a URL query parameter.
func withParam(raw, key, value string) string {
	u, err := url.Parse(raw)
	if err != nil {
		panic(err)
	}
	q := u.Query()
	if value == "" {
		q.Del(key)
	} else {
		q.Set(key, value)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// startBouncer starts a PgBouncer in poolMode in front of upstream, with
// FIFO reuse of idle servers when roundRobin, for the configurations
// testenv.StartPgBouncer (transaction mode, LIFO) does not give. It needs
// the binary StartPgBouncer installs. The URL has pgx's default query
// mode.
func startBouncer(t *testing.T, upstream *pgx.ConnConfig, poolMode string, roundRobin bool) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
	}
	dir, err := os.MkdirTemp("", "claimtx-store-pgbouncer-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	rr := 0
	if roundRobin {
		rr = 1
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir = %s
pidfile = %s/pgbouncer.pid
logfile = %s/pgbouncer.log
pool_mode = %s
server_round_robin = %d
auth_type = trust
auth_file = %s/userlist.txt
max_client_conn = 500
default_pool_size = 8
query_wait_timeout = 60
ignore_startup_parameters = extra_float_digits
`, upstream.Host, upstream.Port, port, dir, dir, dir, poolMode, rr, dir)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(`"postgres" ""`+"\n"), 0o600))
	args := []string{"-d", filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root.
		out, err := exec.Command("chown", "-R", "postgres:", dir).CombinedOutput()
		require.NoError(t, err, "%s", out)
		args = append([]string{"-u", "postgres"}, args...)
	}
	out, err := exec.Command(bin, args...).CombinedOutput() //nolint:gosec // the test's own configuration
	require.NoError(t, err, "%s", out)
	t.Cleanup(func() {
		pid, err := os.ReadFile(filepath.Join(dir, "pgbouncer.pid"))
		if err == nil {
			_ = exec.Command("kill", "-TERM", strings.TrimSpace(string(pid))).Run()
		}
	})
	raw := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/test?sslmode=disable", port)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, raw)
		if err != nil {
			return false
		}
		return !errors.Is(conn.Close(ctx), context.DeadlineExceeded)
	}, 10*time.Second, 50*time.Millisecond, "pgbouncer %s on port %d", poolMode, port)
	return raw
}

// Replicas starting together behind a pooler with fewer servers than
// probes, beside other clients' transactions: each probe's second
// connection holds a server in a transaction while its first one waits for
// one, and the other clients take idle servers between the probe's
// statements. The probes must not starve each other until the pooler's
// query_wait_timeout (120 s), and none may take the pooler for a direct
// connection because a server came back to it by chance.
func TestPoolerProbesStartingTogether(t *testing.T) {
	t.Parallel()
	direct := directConfig(t)
	bouncer := testenv.StartPgBouncer(t, direct.Host, int(direct.Port)) // 8 servers at most
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	load := poolerStore(t, bouncer).Pool()
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	for range 4 {
		go func() {
			for loadCtx.Err() == nil {
				_, _ = load.Exec(loadCtx, "SELECT 1")
			}
		}()
	}
	const replicas, rounds = 12, 4
	for range rounds {
		errs := make(chan error, replicas)
		for range replicas {
			st := poolerStore(t, bouncer)
			go func() {
				pooled, err := st.BehindTransactionPooler(ctx)
				if err == nil && !pooled {
					err = errors.New("a replica took the pooler for a direct connection")
				}
				errs <- err
			}()
		}
		for range replicas {
			require.NoError(t, <-errs)
		}
	}
}
