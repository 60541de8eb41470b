package testenv

// A Postgres cluster of the test's own, for tests that restart Postgres:
// restarting the machine's server would break whatever else runs on it.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

// PGCluster is a Postgres server the test started (StartPGCluster) in a
// temporary directory, on a free loopback port, trust authentication,
// superuser postgres. It is stopped and removed when the test ends.
type PGCluster struct {
	bin, dir, log string
	port          int
	// asPostgres runs the server tools as the postgres OS user: initdb refuses root.
	asPostgres bool
}

// StartPGCluster initdbs and starts a cluster with the machine's initdb and
// pg_ctl (on PATH, else the newest /usr/lib/postgresql/*/bin), else SkipOrFail.
func StartPGCluster(t testing.TB) *PGCluster {
	t.Helper()
	bin := pgBinDir()
	if bin == "" {
		SkipOrFail(t, "initdb and pg_ctl not found (on PATH or in /usr/lib/postgresql/*/bin)")
		return nil
	}
	c := &PGCluster{bin: bin, asPostgres: os.Geteuid() == 0}
	sock, ok := c.prepare(t, "claimtx-pg-")
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.run(ctx, "initdb", "-D", c.dir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	c.start(ctx, t, sock)
	return c
}

// prepare makes the cluster's temporary directory (removed when the test
// ends, owned by the postgres OS user when the tools run as it), which
// holds the socket too, and picks a free port; !ok: the test was skipped.
func (c *PGCluster) prepare(t testing.TB, prefix string) (dir string, ok bool) {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	c.dir, c.log = filepath.Join(dir, "data"), filepath.Join(dir, "log")
	if c.asPostgres {
		u, err := user.Lookup("postgres")
		if err != nil {
			SkipOrFail(t, "running as root, initdb needs the postgres OS user: %v", err)
			return "", false
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatalf("testenv: postgres user ids: %v", err)
		}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
	c.port = freePort(t)
	return dir, true
}

// start starts the server with its socket in sock, stopped when the test ends.
func (c *PGCluster) start(ctx context.Context, t testing.TB, sock string) {
	t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1", c.port, sock)
	if err := c.run(ctx, "pg_ctl", "-D", c.dir, "-l", c.log, "-o", opts, "-w", "-t", "60", "start"); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
}

// URL is the cluster's address for database, as user postgres.
func (c *PGCluster) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, database)
}

// Restart stops the server (fast: sessions are ended, as a restart of a
// real server ends them) and starts it again, returning once it accepts
// connections. The server keeps its options; -l again, or it would write
// its log to (and hold open) pg_ctl's output.
func (c *PGCluster) Restart(ctx context.Context) error {
	return c.run(ctx, "pg_ctl", "-D", c.dir, "-l", c.log, "-m", "fast", "-w", "-t", "60", "restart")
}

// Stop stops the server if it runs; StartPGCluster's cleanup calls it.
func (c *PGCluster) Stop(ctx context.Context) error {
	if c.run(ctx, "pg_ctl", "-D", c.dir, "status") != nil {
		return nil
	}
	return c.run(ctx, "pg_ctl", "-D", c.dir, "-m", "fast", "-w", "-t", "60", "stop")
}

func (c *PGCluster) run(ctx context.Context, tool string, args ...string) error {
	name := filepath.Join(c.bin, tool)
	if c.asPostgres {
		args = append([]string{"-u", "postgres", "--", name}, args...)
		name = "runuser"
	}
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput() //nolint:gosec // the machine's initdb/pg_ctl, or runuser running them
	if err != nil {
		return fmt.Errorf("%s %v: %w: %s", tool, args, err, out)
	}
	return nil
}

// pgBinDir is the directory holding initdb and pg_ctl, "" if none does.
func pgBinDir() string {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p)
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(found) == 0 {
		return ""
	}
	// The newest version, in numeric order (9.6 < 15 < 16).
	version := func(initdb string) (v float64) {
		_, _ = fmt.Sscan(filepath.Base(filepath.Dir(filepath.Dir(initdb))), &v)
		return v
	}
	return filepath.Dir(slices.MaxFunc(found, func(a, b string) int { return cmp.Compare(version(a), version(b)) }))
}

// StartStandby starts a streaming standby of c, for tests of what a consumer
// sees of replication: a base backup of c (pg_basebackup -R, following c) on
// a free loopback port, stopped and removed when the test ends (or by Stop).
// It is synchronous when c's synchronous_standby_names matches it ('*').
func (c *PGCluster) StartStandby(t testing.TB) *PGCluster {
	t.Helper()
	s := &PGCluster{bin: c.bin, asPostgres: c.asPostgres}
	// initdb and pg_ctl may be links on PATH into the directory of pg_basebackup.
	if _, err := os.Stat(filepath.Join(s.bin, "pg_basebackup")); err != nil {
		real, err := filepath.EvalSymlinks(filepath.Join(s.bin, "initdb"))
		if err != nil {
			t.Fatalf("testenv: pg_basebackup not beside initdb: %v", err)
		}
		s.bin = filepath.Dir(real)
	}
	sock, ok := s.prepare(t, "claimtx-pg-standby-")
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// initdb's trust lines include replication from 127.0.0.1.
	if err := s.run(ctx, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-U", "postgres",
		"-D", s.dir, "-R", "-X", "stream", "--no-sync"); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	s.start(ctx, t, sock)
	return s
}
