// Package api is a test, beside the golden files it checks: it lists the
// exported surface of claimtx's library packages, one sorted line per
// identifier in the style of Go's own api/ files, counts it, and fails
// when the golden files here are stale. It is test code because nothing but
// the build uses it:
//
//	go test ./docs/api                          # check docs/api (make lint, make test)
//	go test ./docs/api -run Golden -args -write # rewrite docs/api (make api)
//	go test ./docs/api -run Count -v            # names per package (make api-count)
//
// A package's types are read from the compiler's export data (`go list
// -export`), so the listing is exactly what an importer sees.
package api
