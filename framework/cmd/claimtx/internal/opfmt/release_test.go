package opfmt_test

import (
	"testing"
	"time"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
	"github.com/claimtx/claimtx/internal/pg"
)

func TestRelease(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	past, later := now.Add(-time.Second), now.Add(90*time.Second)
	for _, c := range []struct {
		k    pg.ParkedKey
		want string
	}{
		{pg.ParkedKey{}, "on request"},
		{pg.ParkedKey{RetryAt: &later}, "automatic in 1m30s"},
		{pg.ParkedKey{RetryAt: &past}, "due now"},
		{pg.ParkedKey{RetryAt: &past, RequestedBy: "ops"}, "retry requested by ops"},
		{pg.ParkedKey{RetryAt: &past, RequestedBy: "ops", SkipHead: true}, "skip requested by ops"},
		{pg.ParkedKey{RetryAt: &past, SkipHead: true}, "skip requested by ?"},
	} {
		if got := opfmt.Release(c.k, now); got != c.want {
			t.Errorf("Release(%+v) = %q, want %q", c.k, got, c.want)
		}
	}
}
