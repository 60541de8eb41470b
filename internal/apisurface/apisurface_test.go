package apisurface_test

import (
	"testing"

	"github.com/claimtx/claimtx/internal/apisurface"
)

// TestGolden fails when the exported surface differs from docs/api, so an API
// change cannot land without its reviewed diff.
func TestGolden(t *testing.T) {
	t.Chdir("../..") // the module root, so the message names docs/api as `make api` does
	pkgs, err := apisurface.Load(".")
	if err != nil {
		t.Fatal(err)
	}
	if err := apisurface.Check(pkgs, "docs/api"); err != nil {
		t.Fatal(err)
	}
}

func TestDiff(t *testing.T) {
	got := apisurface.Diff([]string{"a", "b", "d"}, []string{"b", "c", "d", "e"})
	if want := "- a\n+ c\n+ e\n"; got != want {
		t.Fatalf("Diff = %q, want %q", got, want)
	}
	if got := apisurface.Diff([]string{"a"}, []string{"a"}); got != "" {
		t.Fatalf("Diff of equal lists = %q, want empty", got)
	}
}
