// Package api is a test, beside the golden files it checks: it lists the
// exported surface of claimtx's library packages, one sorted line per
// identifier (read from the compiler's export data, so exactly what an
// importer sees), counts it, and fails when the golden files are stale.
// README.md here says how to rewrite them (make api) and count them (make
// api-count).
package api
