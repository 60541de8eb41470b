package kafka_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers/kafka"
	"github.com/claimtx/claimtx/internal/kafkarecord"
	"github.com/claimtx/claimtx/internal/testenv"
)

func recordOf(t *testing.T, m *message.Message) kafkarecord.Record {
	t.Helper()
	r, ok := kafkarecord.FromContext(m.Context())
	require.True(t, ok, "message context carries its record's place")
	return r
}

func settledBelow(t *testing.T, r kafkarecord.Record, settling ...int64) int64 {
	t.Helper()
	off, ok := r.Of.SettledBelow(settling)
	require.True(t, ok)
	return off
}

// TestSettledBelowOutOfOrderAcks: with a window of several records in
// flight, the settled position is the lowest offset neither acked nor
// settling, not the last offset acked.
func TestSettledBelowOutOfOrderAcks(t *testing.T) {
	t.Parallel()
	const n = 5
	_, cfg, topic := windowTopic(t, n, 1, n)

	sub, msgs := subscribe(t, cfg, topic)
	defer closeSub(t, sub)
	var held []*message.Message
	for i := range n {
		m := receive(t, msgs, 15*time.Second)
		r := recordOf(t, m)
		require.Equal(t, topic, r.Topic)
		require.Equal(t, int32(0), r.Partition)
		require.Equal(t, int64(i), r.Offset)
		held = append(held, m)
	}
	r := recordOf(t, held[0])
	require.Equal(t, int64(0), settledBelow(t, r))
	require.Equal(t, int64(1), settledBelow(t, r, 0))
	require.Equal(t, int64(0), settledBelow(t, r, 3), "record 0 is still in flight")
	require.Equal(t, int64(n), settledBelow(t, r, 0, 1, 2, 3, 4))

	// Acks out of order: 2 and 3 first.
	require.True(t, held[2].Ack())
	require.True(t, held[3].Ack())
	require.Eventually(t, func() bool { return settledBelow(t, r, 0, 1) == 4 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, int64(1), settledBelow(t, r, 0), "1 is in flight")
	require.Equal(t, int64(0), settledBelow(t, r, 4))
	require.True(t, held[4].Ack())
	require.Eventually(t, func() bool { return settledBelow(t, r, 0, 1) == n }, 5*time.Second, 5*time.Millisecond)
	require.True(t, held[0].Ack())
	require.Eventually(t, func() bool { return settledBelow(t, r) == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, int64(n), settledBelow(t, r, 1))
	require.True(t, held[1].Ack())
	require.Eventually(t, func() bool { return settledBelow(t, r) == n }, 5*time.Second, 5*time.Millisecond)

	// A partition no longer this member's says nothing.
	closeSub(t, sub)
	_, ok := r.Of.SettledBelow(nil)
	require.False(t, ok)
}

// mapLoader is a kafkarecord.Loader over fixed positions (the store's is
// tested with Postgres in internal/claimsql and examples/loyalty).
type mapLoader map[int32]int64

func (l mapLoader) LoadPositions(_ context.Context, _ string, parts []int32) (map[int32]int64, error) {
	out := map[int32]int64{}
	for _, p := range parts {
		if off, ok := l[p]; ok {
			out[p] = off
		}
	}
	return out, nil
}

type skip struct {
	topic         string
	partition     int32
	group, stored int64
}

// TestStartsAtStoredPosition: a partition whose stored position is past
// the group's offset starts there and says so; with Replay it starts at
// the group's offset; a stored position past the partition's end (a
// topic created again) is ignored.
func TestStartsAtStoredPosition(t *testing.T) {
	t.Parallel()
	b := startBroker(t)
	for _, c := range []struct {
		name      string
		stored    int64
		replay    bool
		wantFirst int64
		wantSkip  bool
	}{
		{name: "skip", stored: 3, wantFirst: 3, wantSkip: true},
		{name: "replay", stored: 3, replay: true, wantFirst: 0},
		{name: "past the end", stored: 100, wantFirst: 0},
		{name: "at the group offset", stored: 0, wantFirst: 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t, b)
			topic := createTopic(t, b, 1)
			produce(t, cfg, topic, 5)
			sub, err := kafka.NewSubscriber(context.Background(), cfg, watermill.NopLogger{})
			require.NoError(t, err)
			defer closeSub(t, sub)
			var mu sync.Mutex
			var skips []skip
			require.True(t, kafkarecord.Attach(sub, kafkarecord.Options{
				Loader: mapLoader{0: c.stored},
				Replay: c.replay,
				Skipped: func(topic string, partition int32, group, stored int64) {
					mu.Lock()
					defer mu.Unlock()
					skips = append(skips, skip{topic, partition, group, stored})
				},
			}))
			m, _ := testenv.SubscribeReceive(t, sub, topic, 15*time.Second)
			require.Equal(t, strconv.FormatInt(c.wantFirst, 10), m.Metadata.Get(kafkarecord.KafkaOffset))
			require.True(t, m.Ack())
			mu.Lock()
			defer mu.Unlock()
			if c.wantSkip {
				require.Equal(t, []skip{{topic, 0, -1, c.stored}}, skips)
			} else {
				require.Empty(t, skips)
			}
		})
	}
}
