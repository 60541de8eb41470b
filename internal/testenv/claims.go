package testenv

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Install builds a middleware through its constructor (middleware.NewClaim,
// NewPoison, ...), failing the test on a configuration error.
func Install[C any](t testing.TB, build func(C) (message.HandlerMiddleware, error), c C) message.HandlerMiddleware {
	t.Helper()
	mw, err := build(c)
	require.NoError(t, err)
	return mw
}

// Scalar is the one integer that sql returns, failing the test on an error.
func Scalar(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// Message is a message as a producer sends it: a fresh UUID, payload, and
// the metadata given as key, value pairs.
func Message(payload string, metadata ...string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(payload))
	for i := 0; i+1 < len(metadata); i += 2 {
		m.Metadata.Set(metadata[i], metadata[i+1])
	}
	return m
}

// Begin opens a transaction on pool that is rolled back when the test
// ends, unless it was committed or rolled back before.
func Begin(t testing.TB, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}
