package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
)

// TestAwaitDatabase: the user's own start-up step runs under the
// consumer's policy: once when the database is there, not at all without
// a pool, and a failure waiting cannot fix comes back at once as a
// *StartupError naming the step.
func TestAwaitDatabase(t *testing.T) {
	pool, _ := testenv.Setup(t, 2)
	calls := 0
	err := consumer.AwaitDatabase(t.Context(), consumer.Config{Pool: pool}, "create my tables", func(context.Context) error {
		calls++
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, calls)

	var cfgErr *framework.ConfigError
	require.ErrorAs(t, consumer.AwaitDatabase(t.Context(), consumer.Config{}, "create my tables", func(context.Context) error { return nil }), &cfgErr)

	boom := errors.New("boom")
	err = consumer.AwaitDatabase(t.Context(), consumer.Config{Pool: pool, StartupTimeout: time.Minute}, "create my tables", func(context.Context) error { return boom })
	var se *consumer.StartupError
	require.ErrorAs(t, err, &se)
	require.Equal(t, "create my tables", se.Step)
	require.Equal(t, 1, se.Attempts)
	require.ErrorIs(t, err, boom)
}
