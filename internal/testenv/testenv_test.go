package testenv_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/internal/testenv"
)

func TestCI(t *testing.T) {
	for v, want := range map[string]bool{"": false, "true": true, "1": true, "false": false, "0": false, "yes": false} {
		t.Setenv("CI", v)
		if got := testenv.CI(); got != want {
			t.Errorf("CI=%q: CI() = %v, want %v", v, got, want)
		}
	}
}

// fakeT records how SkipOrFail ended a test without ending this one.
type fakeT struct {
	testing.TB
	skipped, failed bool
}

func (f *fakeT) Helper()               {}
func (f *fakeT) Skipf(string, ...any)  { f.skipped = true }
func (f *fakeT) Fatalf(string, ...any) { f.failed = true }

func TestRequireToolMissing(t *testing.T) {
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		f := &fakeT{}
		testenv.RequireTool(f, "claimtx-no-such-tool")
		if f.skipped == (ci != "") || f.failed != (ci != "") {
			t.Errorf("CI=%q: skipped=%v failed=%v; want a skip outside CI and a failure under it", ci, f.skipped, f.failed)
		}
	}
}

func TestRequireToolPresent(t *testing.T) {
	t.Setenv("CI", "true")
	if testenv.RequireTool(t, "go") == "" {
		t.Fatal("no path for go")
	}
}

// TestPGCluster: the private cluster takes connections, a restart ends
// their sessions and it takes new ones after, as a restarted server does.
func TestPGCluster(t *testing.T) {
	t.Parallel()
	c := testenv.StartPGCluster(t)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("a session survived the restart")
	}
	again, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	_ = again.Close(ctx)
}
