package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
)

func TestClassifyPostgres(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("connect: %w", &pgconn.PgError{Code: code, Message: code}) }
	for _, tc := range []struct {
		err         error
		retry, auth bool
	}{
		{pg("57P03"), true, false}, // failover: shutting down / starting up
		{pg("57P01"), true, false},
		{pg("08006"), true, false},
		{pg("53300"), true, false},
		{syscall.ECONNREFUSED, true, false},
		{pg("28P01"), false, true},
		{pg("28000"), false, true},
		{pg("3D000"), false, false}, // database does not exist: waiting will not create it
		{pg("42501"), false, false},
		{errors.New("something else"), false, false},
	} {
		retry, err := classifyPostgres(tc.err)
		require.Equal(t, tc.retry, retry, "%v", tc.err)
		require.Equal(t, tc.auth, errors.As(err, new(*framework.AuthError)), "%v", tc.err)
		require.ErrorIs(t, err, tc.err)
	}
}

// TestAwaitRetriesThenFails: retryable errors are retried, logged at WARN,
// until the timeout; the error is the last real cause.
func TestAwaitRetriesThenFails(t *testing.T) {
	t.Parallel()
	var buf strings.Builder
	logger := slog.New(slog.NewTextHandler(&buf, nil)) // read after await returns
	cause := &pgconn.PgError{Code: "57P03", Message: "the database system is shutting down"}
	var attempts atomic.Int32
	start := time.Now()
	err := await(t.Context(), logger, 500*time.Millisecond, "PostgreSQL", "test", classifyPostgres, func(context.Context) error {
		attempts.Add(1)
		return cause
	})
	var se *StartupError
	require.ErrorAs(t, err, &se)
	require.ErrorIs(t, err, cause)
	require.Equal(t, "PostgreSQL", se.Dependency)
	require.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond)
	require.Less(t, time.Since(start), 3*time.Second)
	require.Greater(t, attempts.Load(), int32(1))
	require.Contains(t, buf.String(), "level=WARN")
	require.Contains(t, buf.String(), "dependency=PostgreSQL")
	require.Contains(t, buf.String(), "57P03")
}

// TestAwaitAuthNotRetried: an authentication failure ends at once.
func TestAwaitAuthNotRetried(t *testing.T) {
	t.Parallel()
	var attempts atomic.Int32
	err := await(t.Context(), slog.New(slog.DiscardHandler), time.Minute, "PostgreSQL", "test", classifyPostgres, func(context.Context) error {
		attempts.Add(1)
		return &pgconn.PgError{Code: "28P01"}
	})
	require.ErrorAs(t, err, new(*framework.AuthError))
	require.Equal(t, int32(1), attempts.Load())
}

// TestAwaitRecovers: success after failures returns nil.
func TestAwaitRecovers(t *testing.T) {
	t.Parallel()
	var attempts atomic.Int32
	err := await(t.Context(), slog.New(slog.DiscardHandler), time.Minute, "PostgreSQL", "test", classifyPostgres, func(context.Context) error {
		if attempts.Add(1) < 3 {
			return syscall.ECONNREFUSED
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, int32(3), attempts.Load())
}
