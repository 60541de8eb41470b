package kafka_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/kafka"
	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
)

// ReplayHorizon reads what the broker will keep: a topic's retention.ms,
// unbounded for -1 and for compacted topics.
func TestReplayHorizon(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	br, err := kafkatest.Start(ctx, kafkatest.Options{Addr: "127.0.0.1:0", DisableAutoCreateTopics: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = br.Close() })
	cl, err := kgo.NewClient(kgo.SeedBrokers(br.Addrs()...))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	str := func(s string) *string { return &s }
	for name, cfg := range map[string]map[string]*string{
		"day":     {"retention.ms": str("86400000")},
		"forever": {"retention.ms": str("-1")},
		"compact": {"cleanup.policy": str("compact")},
	} {
		_, err := adm.CreateTopic(ctx, 1, 1, cfg, name)
		require.NoError(t, err)
	}
	sub, err := kafka.NewSubscriber(ctx, brokers.KafkaConfig{Brokers: br.Addrs(), ConsumerGroup: "horizon"}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })

	for topic, want := range map[string]time.Duration{
		"day":     24 * time.Hour,
		"forever": math.MaxInt64,
		"compact": math.MaxInt64,
	} {
		got, err := sub.ReplayHorizon(ctx, topic)
		require.NoError(t, err, topic)
		require.Equal(t, want, got, topic)
	}
	// A topic not created yet gets the broker's default.
	got, err := sub.ReplayHorizon(ctx, "not-yet")
	require.NoError(t, err)
	require.Positive(t, got)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = sub.ReplayHorizon(cctx, "day")
	require.ErrorIs(t, err, context.Canceled)
}
