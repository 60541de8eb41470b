package testenv

import (
	"context"
	"os"
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
