package replay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework/internal/replay"
)

type horizonSub struct {
	message.Subscriber
	horizons map[string]time.Duration
}

func (s horizonSub) ReplayHorizon(_ context.Context, topic string) (time.Duration, error) {
	d, ok := s.horizons[topic]
	if !ok {
		return 0, errors.New("no such topic")
	}
	return d, nil
}

// TestHorizon: the longest horizon of the topics, or not known.
func TestHorizon(t *testing.T) {
	t.Parallel()
	sub := horizonSub{horizons: map[string]time.Duration{"a": time.Hour, "b": brokers.UnboundedHorizon, "c": 2 * time.Hour}}
	d, ok, err := replay.Horizon(t.Context(), sub, "a", "c")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 2*time.Hour, d)
	d, _, err = replay.Horizon(t.Context(), sub, "a", "b")
	require.NoError(t, err)
	require.Equal(t, "unbounded", replay.Format(d))
	_, ok, err = replay.Horizon(t.Context(), sub, "x")
	require.True(t, ok)
	require.Error(t, err)
	_, ok, err = replay.Horizon(t.Context(), horizonSub{}.Subscriber, "a")
	require.False(t, ok)
	require.NoError(t, err)
	require.Equal(t, "1h0m0s", replay.Format(time.Hour))
}
