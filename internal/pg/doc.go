// Package pg holds the Postgres helpers store, middleware and the CLI
// share, so they cannot drift apart: the table names rendered into SQL,
// the store's defaults, the classification of database errors for the
// retry decision, the claim transaction's context key and rollback, and
// the outbox's notification channel.
package pg
