package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/constant"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"maps"
	"os"
	"os/exec"
	pathpkg "path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Package is the exported surface of one library package.
type Package struct {
	Path  string   // import path
	Rel   string   // path relative to the module root: "store/outbox"
	Lines []string // sorted, one per identifier (and one per struct type/interface header)
	Count Count
}

// Count counts identifiers the way issue 14 does.
type Count struct {
	Names   int // top-level exported consts, vars, funcs and types
	Methods int // exported methods declared on exported types, interface methods included
	Fields  int // exported fields (embedded ones included) of exported struct types
}

// Total is Names + Methods + Fields.
func (c Count) Total() int { return c.Names + c.Methods + c.Fields }

// GoldenFile is the name of a package's golden file: "store/outbox" -> "store_outbox.txt".
func (p Package) GoldenFile() string { return strings.ReplaceAll(p.Rel, "/", "_") + ".txt" }

type listed struct {
	ImportPath, Name, Export string
	DepOnly                  bool
	Module                   *struct{ Path string }
	Error                    *struct{ Err string }
}

// Load lists the library packages of the module rooted at dir: every non-main
// package of the module outside internal/ and examples/ directories. A
// package under cmd/ is one too: framework/cmd/claimtx/claimtxcli is
// imported by programs that serve the CLI themselves.
func Load(dir string) ([]Package, error) {
	cmd := exec.Command("go", "list", "-export", "-deps", "-json=ImportPath,Name,Export,DepOnly,Module,Error", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w\n%s", err, stderr.Bytes())
	}
	exports := map[string]string{}
	var libs []listed
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, err
		}
		if p.Error != nil {
			return nil, fmt.Errorf("%s: %s", p.ImportPath, p.Error.Err)
		}
		exports[p.ImportPath] = p.Export
		if !p.DepOnly && p.Module != nil && isLibrary(p.Module.Path, p.ImportPath, p.Name) {
			libs = append(libs, p)
		}
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		if exports[path] == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(exports[path])
	})
	var pkgs []Package
	for _, l := range libs {
		tp, err := imp.Import(l.ImportPath)
		if err != nil {
			return nil, err
		}
		p := describe(tp)
		p.Rel = strings.TrimPrefix(strings.TrimPrefix(l.ImportPath, l.Module.Path), "/")
		if p.Rel == "" {
			p.Rel = pathpkg.Base(l.ImportPath) // a package at the module root: claimtx.txt
		}
		pkgs = append(pkgs, p)
	}
	slices.SortFunc(pkgs, func(a, b Package) int { return strings.Compare(a.Path, b.Path) })
	return pkgs, nil
}

func isLibrary(module, path, name string) bool {
	if name == "main" {
		return false
	}
	for _, elem := range strings.Split(strings.TrimPrefix(path, module), "/") {
		if elem == "internal" || elem == "examples" || elem == "docs" {
			return false
		}
	}
	return true
}

func isInternal(path string) bool {
	return slices.Contains(strings.Split(path, "/"), "internal")
}

// constValue prints a constant's value; durations as "30s", not in nanoseconds.
func constValue(c *types.Const) string {
	if n, ok := c.Type().(*types.Named); ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == "time" && n.Obj().Name() == "Duration" {
		if ns, exact := constant.Int64Val(c.Val()); exact {
			return time.Duration(ns).String()
		}
	}
	return c.Val().ExactString()
}

// describe lists and counts the exported identifiers of pkg.
func describe(pkg *types.Package) Package {
	p := Package{Path: pkg.Path()}
	qual := func(other *types.Package) string {
		if other == pkg {
			return ""
		}
		return other.Name()
	}
	typ := func(t types.Type) string { return types.TypeString(stripNames(t), qual) }
	emit := func(format string, args ...any) {
		p.Lines = append(p.Lines, "pkg "+pkg.Path()+", "+fmt.Sprintf(format, args...))
	}
	// members lists the exported fields, interface methods and methods of
	// named under the name head; header adds the "type T struct" line.
	members := func(head string, named *types.Named, header bool) {
		switch u := named.Underlying().(type) {
		case *types.Struct:
			if header {
				emit("type %s struct", head)
			}
			for f := range u.Fields() {
				if !f.Exported() {
					continue
				}
				p.Count.Fields++
				if f.Embedded() {
					emit("type %s struct, embedded %s", head, typ(f.Type()))
				} else {
					emit("type %s struct, %s %s", head, f.Name(), typ(f.Type()))
				}
			}
		case *types.Interface:
			if header {
				emit("type %s interface", head)
			}
			for e := range u.EmbeddedTypes() {
				emit("type %s interface, embedded %s", head, typ(e))
			}
			for m := range u.ExplicitMethods() {
				if !m.Exported() {
					emit("type %s interface, unexported methods", head)
					continue
				}
				p.Count.Methods++
				emit("type %s interface, %s%s", head, m.Name(), signature(m.Signature(), qual))
			}
		default:
			if header {
				emit("type %s %s", head, typ(u))
			}
		}
		// Members promoted from an unexported embedded type are callable by
		// users although no exported type declares them: they are surface.
		if st, ok := named.Underlying().(*types.Struct); ok {
			for f := range st.Fields() {
				if !f.Embedded() || f.Exported() {
					continue
				}
				if inner, ok := deref(f.Type()).Underlying().(*types.Struct); ok {
					for g := range inner.Fields() {
						if g.Exported() {
							p.Count.Fields++
							emit("type %s struct, %s %s (promoted)", head, g.Name(), typ(g.Type()))
						}
					}
				}
			}
			ms := types.NewMethodSet(types.NewPointer(named))
			for sel := range ms.Methods() {
				m := sel.Obj().(*types.Func)
				if len(sel.Index()) < 2 || !m.Exported() || st.Field(sel.Index()[0]).Exported() {
					continue
				}
				p.Count.Methods++
				emit("method (*%s) %s%s (promoted)", head, m.Name(), signature(m.Signature(), qual))
			}
		}
		for m := range named.Methods() {
			if !m.Exported() {
				continue
			}
			p.Count.Methods++
			recv := head
			if tps := named.TypeParams(); tps.Len() > 0 {
				var ps []string
				for tp := range tps.TypeParams() {
					ps = append(ps, tp.Obj().Name())
				}
				recv = named.Obj().Name() + "[" + strings.Join(ps, ", ") + "]"
			}
			if _, ptr := m.Signature().Recv().Type().(*types.Pointer); ptr {
				recv = "*" + recv
			}
			emit("method (%s) %s%s", recv, m.Name(), signature(m.Signature(), qual))
		}
	}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		p.Count.Names++
		switch obj := obj.(type) {
		case *types.Const:
			emit("const %s %s = %s", name, typ(obj.Type()), constValue(obj))
		case *types.Var:
			emit("var %s %s", name, typ(obj.Type()))
		case *types.Func:
			emit("func %s%s", name, signature(obj.Type().(*types.Signature), qual))
		case *types.TypeName:
			if !obj.IsAlias() {
				named := obj.Type().(*types.Named)
				members(name+typeParams(named.TypeParams(), qual), named, true)
				continue
			}
			target := types.Unalias(obj.Type())
			emit("type %s = %s", name, typ(target))
			// Users see a type from an internal package only through the
			// alias, so its fields and methods are listed here.
			if named, ok := target.(*types.Named); ok && named.Obj().Pkg() != nil && isInternal(named.Obj().Pkg().Path()) {
				members(name, named, false)
			}
		}
	}
	slices.Sort(p.Lines)
	p.Lines = slices.Compact(p.Lines) // "unexported methods" once per interface
	return p
}

// signature prints sig after its func keyword and without parameter names:
// "(context.Context, Config) (*Store, error)".
func signature(sig *types.Signature, qual types.Qualifier) string {
	plain := types.NewSignatureType(nil, nil, nil, stripTuple(sig.Params()), stripTuple(sig.Results()), sig.Variadic())
	return typeParams(sig.TypeParams(), qual) + strings.TrimPrefix(types.TypeString(plain, qual), "func")
}

func typeParams(tps *types.TypeParamList, qual types.Qualifier) string {
	if tps.Len() == 0 {
		return ""
	}
	var ps []string
	for tp := range tps.TypeParams() {
		ps = append(ps, tp.Obj().Name()+" "+types.TypeString(tp.Constraint(), qual))
	}
	return "[" + strings.Join(ps, ", ") + "]"
}

// stripNames returns t with parameter names removed from every func type in
// it, so renaming a parameter does not change the surface.
func stripNames(t types.Type) types.Type {
	switch t := t.(type) {
	case *types.Signature:
		if t.TypeParams().Len() > 0 {
			return t
		}
		return types.NewSignatureType(nil, nil, nil, stripTuple(t.Params()), stripTuple(t.Results()), t.Variadic())
	case *types.Pointer:
		return types.NewPointer(stripNames(t.Elem()))
	case *types.Slice:
		return types.NewSlice(stripNames(t.Elem()))
	case *types.Array:
		return types.NewArray(stripNames(t.Elem()), t.Len())
	case *types.Map:
		return types.NewMap(stripNames(t.Key()), stripNames(t.Elem()))
	case *types.Chan:
		return types.NewChan(t.Dir(), stripNames(t.Elem()))
	}
	return t
}

func stripTuple(t *types.Tuple) *types.Tuple {
	var vars []*types.Var
	for v := range t.Variables() {
		vars = append(vars, types.NewParam(token.NoPos, v.Pkg(), "", stripNames(v.Type())))
	}
	return types.NewTuple(vars...)
}

// Diff lists the lines only in want as "- line" and those only in got as
// "+ line". Both are sorted and free of duplicates, so a set difference reads
// like a unified diff. It returns "" when they are equal.
func Diff(want, got []string) string {
	var b strings.Builder
	for i, j := 0, 0; i < len(want) || j < len(got); {
		switch {
		case j == len(got) || i < len(want) && want[i] < got[j]:
			fmt.Fprintf(&b, "- %s\n", want[i])
			i++
		case i == len(want) || got[j] < want[i]:
			fmt.Fprintf(&b, "+ %s\n", got[j])
			j++
		default:
			i, j = i+1, j+1
		}
	}
	return b.String()
}

// Write writes one golden file per package into dir and removes the golden
// files of packages that no longer exist.
func Write(pkgs []Package, dir string) error {
	old, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil {
		return err
	}
	for _, name := range old {
		if err := os.Remove(name); err != nil {
			return err
		}
	}
	for _, p := range pkgs {
		if err := os.WriteFile(filepath.Join(dir, p.GoldenFile()), []byte(joinLines(p.Lines)), 0o600); err != nil { // git records 0644 whatever the local mode
			return err
		}
	}
	return nil
}

// Check compares pkgs with the golden files in dir and returns an error
// holding the diff, file by file, when they differ.
func Check(pkgs []Package, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil {
		return err
	}
	golden := map[string][]string{}
	for _, name := range files {
		data, err := os.ReadFile(name) //nolint:gosec // the golden files the caller names
		if err != nil {
			return err
		}
		var lines []string // a package that exports nothing has an empty file
		if text := strings.TrimSuffix(string(data), "\n"); text != "" {
			lines = strings.Split(text, "\n")
		}
		golden[filepath.Base(name)] = lines
	}
	var b strings.Builder
	for _, p := range pkgs {
		want, ok := golden[p.GoldenFile()]
		delete(golden, p.GoldenFile())
		if !ok {
			fmt.Fprintf(&b, "%s: missing (new package %s)\n", p.GoldenFile(), p.Path)
		}
		if d := Diff(want, p.Lines); d != "" {
			fmt.Fprintf(&b, "%s:\n%s", p.GoldenFile(), d)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(golden)) {
		fmt.Fprintf(&b, "%s: no such library package any more\n", name)
	}
	if b.Len() > 0 {
		return fmt.Errorf("the exported surface differs from the golden files in %s (- golden, + code);\n"+
			"if the change is intended, run `make api` and commit the result:\n%s", dir, strings.TrimSuffix(b.String(), "\n"))
	}
	return nil
}

// deref returns the type a pointer points to, or t.
func deref(t types.Type) types.Type {
	if ptr, ok := t.(*types.Pointer); ok {
		return ptr.Elem()
	}
	return t
}

// joinLines is the golden file's text: a line each, none for a package
// that exports nothing.
func joinLines(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return strings.Join(lines, "\n") + "\n"
}
