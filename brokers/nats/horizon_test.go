package nats_test

import (
	"context"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
)

// ReplayHorizon reads what JetStream will keep: the capturing stream's
// max_age, unbounded without one (count limits never lengthen it) and for
// a subject the adapter would give a stream of its own.
func TestReplayHorizon(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	name, js := isolated(t)
	_, err := js.AddStream(&natsgo.StreamConfig{Name: name + "-day", Subjects: []string{name + ".day"}, MaxAge: 24 * time.Hour})
	require.NoError(t, err)
	_, err = js.AddStream(&natsgo.StreamConfig{Name: name + "-count", Subjects: []string{name + ".count"}, MaxMsgs: 10})
	require.NoError(t, err)
	sub := newSubscriber(t, config("durable="+name))
	r := sub.(interface {
		ReplayHorizon(context.Context, string) (time.Duration, error)
	})
	for topic, want := range map[string]time.Duration{
		name + ".day":     24 * time.Hour,
		name + ".count":   brokers.UnboundedHorizon,
		name + ".not-yet": brokers.UnboundedHorizon,
	} {
		got, err := r.ReplayHorizon(ctx, topic)
		require.NoError(t, err, topic)
		require.Equal(t, want, got, topic)
	}
	strict := newSubscriber(t, config("durable="+name, "streams=require")).(interface {
		ReplayHorizon(context.Context, string) (time.Duration, error)
	})
	_, err = strict.ReplayHorizon(ctx, name+".not-yet")
	require.ErrorContains(t, err, "stream")

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = r.ReplayHorizon(cctx, name+".day")
	require.ErrorIs(t, err, context.Canceled)
}
