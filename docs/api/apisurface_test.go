package api

import (
	"flag"
	"fmt"
	"strings"
	"testing"
)

var write = flag.Bool("write", false, "rewrite the golden files under docs/api instead of checking them")

// TestGolden fails when the exported surface differs from docs/api, so an API
// change cannot land without its reviewed diff.
func TestGolden(t *testing.T) {
	t.Chdir("../..") // the module root, so the message names docs/api as `make api` does
	pkgs, err := Load(".")
	if err != nil {
		t.Fatal(err)
	}
	if *write {
		err = Write(pkgs, "docs/api")
	} else {
		err = Check(pkgs, "docs/api")
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestCount logs the identifiers per package and in total (make api-count).
func TestCount(t *testing.T) {
	t.Chdir("../..")
	pkgs, err := Load(".")
	if err != nil {
		t.Fatal(err)
	}
	const row = "%-24s %6v %8v %7v %6v\n"
	var b strings.Builder
	fmt.Fprintf(&b, row, "package", "names", "methods", "fields", "total")
	var sum Count
	for _, p := range pkgs {
		c := p.Count
		fmt.Fprintf(&b, row, p.Rel, c.Names, c.Methods, c.Fields, c.Total())
		sum.Names, sum.Methods, sum.Fields = sum.Names+c.Names, sum.Methods+c.Methods, sum.Fields+c.Fields
	}
	fmt.Fprintf(&b, row, "total", sum.Names, sum.Methods, sum.Fields, sum.Total())
	t.Log("\n" + b.String())
}

func TestDiff(t *testing.T) {
	got := Diff([]string{"a", "b", "d"}, []string{"b", "c", "d", "e"})
	if want := "- a\n+ c\n+ e\n"; got != want {
		t.Fatalf("Diff = %q, want %q", got, want)
	}
	if got := Diff([]string{"a"}, []string{"a"}); got != "" {
		t.Fatalf("Diff of equal lists = %q, want empty", got)
	}
}
