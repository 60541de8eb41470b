// Package pg holds the Postgres helpers store, middleware and the CLI
// share, so they cannot drift apart.
package pg
