package kafka

import (
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/internal/kafkarecord"
)

// reservedPrefix marks the metadata the adapter sets from the record
// (kafkarecord's keys): where this copy was stored, so Marshal never
// publishes it. Marshal reads kafka_timestamp, though, so that a poison,
// relayed or replayed copy keeps the record's timestamp.
const reservedPrefix = "kafka_"

// PartitionKeyMetadata is the metadata entry whose value the Publisher
// uses as the record key, so messages with the same value land on the same
// partition and keep their order. It is published as a header too.
const PartitionKeyMetadata = "partition_key"

// marshaler is the publisher's message-to-record conversion (package
// documentation, "Plain producers and metadata").
type marshaler struct{}

func (marshaler) Marshal(topic string, msg *message.Message) (*sarama.ProducerMessage, error) {
	headers := make([]sarama.RecordHeader, 0, len(msg.Metadata)+1)
	headers = append(headers, sarama.RecordHeader{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(msg.UUID)})
	for k, v := range msg.Metadata {
		if strings.HasPrefix(k, reservedPrefix) || k == wkafka.UUIDHeaderKey {
			continue
		}
		headers = append(headers, sarama.RecordHeader{Key: []byte(k), Value: []byte(v)})
	}
	pm := &sarama.ProducerMessage{
		Topic:   topic,
		Value:   sarama.ByteEncoder(msg.Payload),
		Headers: headers,
	}
	if key, ok := msg.Metadata[PartitionKeyMetadata]; ok {
		pm.Key = sarama.StringEncoder(key)
	}
	if v, ok := msg.Metadata[kafkarecord.KafkaTimestamp]; ok {
		// A value we wrote always parses. Anything else (a relayed RabbitMQ
		// header, say) was never a record's time: the record gets the
		// publish time, as failing would make the message unpublishable.
		if ts, err := parseTimestamp(v); err == nil {
			pm.Timestamp = ts
		}
	}
	return pm, nil
}

// parseTimestamp reads a kafka_timestamp value back, refusing what Kafka
// cannot carry: a time before 1970 would be sent as a missing timestamp.
func parseTimestamp(v string) (time.Time, error) {
	ts, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("not an RFC 3339 time: %w", err)
	}
	if ts.UnixMilli() < 0 {
		return time.Time{}, fmt.Errorf("%s is before 1970, which Kafka cannot carry", v)
	}
	return ts, nil
}
