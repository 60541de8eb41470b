package kafka_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers/kafka"
	"github.com/claimtx/claimtx/internal/kafkarecord"
)

// Marshal turns the kafka_timestamp metadata that Unmarshal writes back
// into the record timestamp, so a copy keeps its event time; without it
// the timestamp is left for the producer to stamp, and so with a value no
// record ever carried (a hostile or relayed header): the publish must not
// fail, or the poison copy of that message could never be published.
func TestMarshalKeepsRecordTimestamp(t *testing.T) {
	t.Parallel()
	ts := time.Date(2024, 2, 3, 4, 5, 6, 7_000_000, time.UTC)
	consumed := kafka.UnmarshalRecord(&kgo.Record{Topic: "a", Value: []byte("x"), Timestamp: ts})
	require.Equal(t, "2024-02-03T04:05:06.007Z", consumed.Metadata.Get(kafkarecord.KafkaTimestamp))

	pm, err := kafka.Marshaler{}.Marshal("b", consumed.Copy())
	require.NoError(t, err)
	require.True(t, pm.Timestamp.Equal(ts), "record timestamp %s", pm.Timestamp)
	for _, h := range pm.Headers {
		require.NotEqual(t, kafkarecord.KafkaTimestamp, string(h.Key), "kafka_* metadata is never a header")
	}

	pm, err = kafka.Marshaler{}.Marshal("b", message.NewMessage("fresh", nil))
	require.NoError(t, err)
	require.True(t, pm.Timestamp.IsZero(), "a new message is stamped by the producer")

	for _, bad := range []string{"", "yesterday", "1706933106007", "1969-12-31T23:59:59Z"} {
		m := message.NewMessage("bad", nil)
		m.Metadata.Set(kafkarecord.KafkaTimestamp, bad)
		pm, err := kafka.Marshaler{}.Marshal("b", m)
		require.NoError(t, err, "value %q", bad)
		require.True(t, pm.Timestamp.IsZero(), "value %q", bad)
	}
}

// TestMetadataNames pins the names users write as strings in key specs
// and the package documentation lists; the kafka:timestamp event-time
// spec of package framework reads the adapter's timestamp key.
func TestMetadataNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, "kafka_topic", kafkarecord.KafkaTopic)
	require.Equal(t, "kafka_partition", kafkarecord.KafkaPartition)
	require.Equal(t, "kafka_offset", kafkarecord.KafkaOffset)
	require.Equal(t, "kafka_key", kafkarecord.KafkaKey)
	require.Equal(t, "kafka_timestamp", kafkarecord.KafkaTimestamp)
	require.Equal(t, "_watermill_message_uuid", kafkarecord.KafkaUUIDHeader)
	require.Equal(t, "partition_key", kafka.PartitionKeyMetadata)
	require.Equal(t, kafkarecord.KafkaTimestamp, kafkarecord.KafkaTimestamp)
}
