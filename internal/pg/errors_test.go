package pg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err       error
		want      Cause
		transient bool
	}{
		{nil, None, false},
		{errors.New("x"), None, false},
		{&pgconn.PgError{Code: "40001"}, Serialization, true},
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "40P01"}), Deadlock, true},
		{&pgconn.PgError{Code: "55P03"}, ClaimWait, true},
		{&pgconn.PgError{Code: "23505"}, UniqueViolation, false},
		{&pgconn.PgError{Code: "08006"}, Connection, true},
		{&pgconn.PgError{Code: "57P01"}, Connection, true},
		{&pgconn.PgError{Code: "42P01"}, None, false},
		{io.ErrUnexpectedEOF, Connection, true},
		{context.Canceled, None, false},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), None, false},
	} {
		require.Equal(t, tc.want, Classify(tc.err), "%v", tc.err)
		require.Equal(t, tc.transient, Classify(tc.err).Transient(), "%v", tc.err)
		require.NotEmpty(t, tc.want.String())
	}
}

func TestSQLState(t *testing.T) {
	t.Parallel()
	require.Equal(t, "23514", SQLState(fmt.Errorf("x: %w", &pgconn.PgError{Code: "23514"})))
	require.Empty(t, SQLState(errors.New("x")))
}
