package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// StartStandby starts a streaming standby of c, for tests of what a
// consumer sees of replication: a base backup of c (pg_basebackup -R, so
// it follows c) in a temporary directory, started on a free loopback port.
// It is stopped and removed when the test ends, or by Stop. Whether it is
// synchronous is c's synchronous_standby_names ('*' matches it).
func (c *PGCluster) StartStandby(t testing.TB) *PGCluster {
	t.Helper()
	s := &PGCluster{bin: c.bin, asPostgres: c.asPostgres}
	// initdb and pg_ctl may be links on PATH to a directory that also
	// holds pg_basebackup.
	if _, err := os.Stat(filepath.Join(s.bin, "pg_basebackup")); err != nil {
		real, err := filepath.EvalSymlinks(filepath.Join(s.bin, "initdb"))
		if err != nil {
			t.Fatalf("testenv: pg_basebackup not beside initdb: %v", err)
		}
		s.bin = filepath.Dir(real)
	}
	dir, err := os.MkdirTemp("", "claimtx-pg-standby-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if s.asPostgres {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
	s.dir, s.log = filepath.Join(dir, "data"), filepath.Join(dir, "log")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	s.port = ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// initdb's trust lines include replication from 127.0.0.1.
	if err := s.run(ctx, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-U", "postgres",
		"-D", s.dir, "-R", "-X", "stream", "--no-sync"); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1", s.port, dir)
	if err := s.run(ctx, "pg_ctl", "-D", s.dir, "-l", s.log, "-o", opts, "-w", "-t", "60", "start"); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	return s
}
