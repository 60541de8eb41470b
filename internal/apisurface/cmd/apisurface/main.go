// Command apisurface prints the exported surface of claimtx's library
// packages, writes or checks the golden files under docs/api, and counts the
// surface. Run it from the module root:
//
//	go run ./internal/apisurface/cmd/apisurface              # print every line
//	go run ./internal/apisurface/cmd/apisurface -write docs/api
//	go run ./internal/apisurface/cmd/apisurface -check docs/api
//	go run ./internal/apisurface/cmd/apisurface -count
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/claimtx/claimtx/internal/apisurface"
)

func main() {
	write := flag.String("write", "", "write the golden files into `dir`")
	check := flag.String("check", "", "fail with a diff unless the golden files in `dir` match the code")
	count := flag.Bool("count", false, "print the identifiers per package and in total")
	flag.Parse()

	pkgs, err := apisurface.Load(".")
	if err != nil {
		fail(err)
	}
	switch {
	case *write != "":
		err = apisurface.Write(pkgs, *write)
	case *check != "":
		err = apisurface.Check(pkgs, *check)
	case *count:
		printCount(pkgs)
	default:
		for _, p := range pkgs {
			fmt.Println(strings.Join(p.Lines, "\n"))
		}
	}
	if err != nil {
		fail(err)
	}
}

func printCount(pkgs []apisurface.Package) {
	const row = "%-24s %6v %8v %7v %6v\n"
	fmt.Printf(row, "package", "names", "methods", "fields", "total")
	var sum apisurface.Count
	for _, p := range pkgs {
		c := p.Count
		fmt.Printf(row, p.Rel, c.Names, c.Methods, c.Fields, c.Total())
		sum.Names, sum.Methods, sum.Fields = sum.Names+c.Names, sum.Methods+c.Methods, sum.Fields+c.Fields
	}
	fmt.Printf(row, "total", sum.Names, sum.Methods, sum.Fields, sum.Total())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "apisurface:", err)
	os.Exit(1)
}
