package pg_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/pg"
)

func TestSleep(t *testing.T) {
	t.Parallel()
	require.NoError(t, pg.Sleep(context.Background(), time.Millisecond), "the wait elapsed")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	require.ErrorIs(t, pg.Sleep(ctx, time.Hour), context.Canceled, "the context ended the wait")
	require.Less(t, time.Since(start), time.Minute)
}
