package timing_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/timing"
)

func TestSleep(t *testing.T) {
	t.Parallel()
	require.NoError(t, timing.Sleep(context.Background(), time.Millisecond), "the wait elapsed")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	require.ErrorIs(t, timing.Sleep(ctx, time.Hour), context.Canceled, "the context ended the wait")
	require.Less(t, time.Since(start), time.Minute)
}
