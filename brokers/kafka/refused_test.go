package kafka_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers/kafka"
	"github.com/claimtx/claimtx/framework"
)

// TestPublishRefusalsArePermanent: a message Kafka will never take as it is
// fails with a framework.Permanent error, which the Poison middleware acts
// on (a smaller copy, then the dead-letter table) instead of nacking the
// original forever: over Sarama's Producer.MaxMessageBytes (1 MiB,
// checked before sending) and over the topic's max.message.bytes (the
// broker's MESSAGE_TOO_LARGE). A message that fits goes through
// afterwards on the same publisher.
func TestPublishRefusalsArePermanent(t *testing.T) {
	t.Parallel()
	b := startBroker(t)
	cfg := testConfig(t, b)
	topic, small := uniqueName(t), uniqueName(t)+"-small"
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	limit := "2048"
	_, err = kadm.NewClient(cl).CreateTopic(context.Background(), 1, 1, map[string]*string{"max.message.bytes": &limit}, small)
	require.NoError(t, err)
	pub, err := kafka.NewPublisher(context.Background(), cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	err = pub.Publish(topic, message.NewMessage("big", make([]byte, 1<<20)))
	require.Error(t, err)
	require.True(t, framework.IsPermanent(err), "over Producer.MaxMessageBytes: %v", err)

	err = pub.Publish(small, message.NewMessage("over", make([]byte, 4096)))
	require.Error(t, err)
	require.True(t, framework.IsPermanent(err), "over the topic's max.message.bytes: %v", err)

	require.NoError(t, pub.Publish(small, message.NewMessage("ok", make([]byte, 100))), "what fits goes through")
	require.NoError(t, pub.Publish(topic, message.NewMessage("ok", make([]byte, 100))))
}
