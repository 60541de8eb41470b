package api

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"slices"
	"testing"
)

// Methods and fields promoted from an unexported embedded type are callable
// by users, so they are counted and listed like declared ones.
func TestDescribeCountsPromotedMembers(t *testing.T) {
	const src = `package p
type parts struct{ Shared int; hidden int }
func (*parts) Close() error { return nil }
func (*parts) close() {}
type Consumer struct {
	*parts
	Name string
}
func (*Consumer) Run() {}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := (&types.Config{}).Check("example.com/p", fset, []*ast.File{f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := describe(pkg)
	want := Count{Names: 1, Methods: 2, Fields: 2} // Consumer; Run, Close; Name, Shared
	if got.Count != want {
		t.Fatalf("count = %+v, want %+v; lines:\n%v", got.Count, want, got.Lines)
	}
	for _, line := range []string{
		"pkg example.com/p, method (*Consumer) Close() error (promoted)",
		"pkg example.com/p, type Consumer struct, Shared int (promoted)",
	} {
		if !slices.Contains(got.Lines, line) {
			t.Errorf("missing %q in:\n%v", line, got.Lines)
		}
	}
}
