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

// reservedPrefix marks the metadata keys the adapter sets from the Kafka
// record on consume (kafkarecord's KafkaTopic, KafkaOffset, ...). They
// describe where and when this copy of the message was stored, so Marshal
// never publishes them as headers, and claimtx never derives a claim key
// from them by default (an offset changes when a message is republished).
//
// kafka_timestamp is the record timestamp (producer create time, or
// broker append time when the topic uses LogAppendTime), RFC 3339 with
// nanoseconds in UTC; absent when the record has none. It is stable across
// redeliveries of the same record, which is what a retention rule based on
// event time needs. Unlike the other kafka_* keys it is also read by
// Marshal: a copy published with it (a poison copy, a relayed or replayed
// message) keeps the original record's timestamp instead of getting the
// time of the republish.
const reservedPrefix = "kafka_"

// PartitionKeyMetadata is the metadata entry whose value the Publisher
// uses as the record key, so messages with the same value land on the same
// partition and keep their order. It is published as a header too.
const PartitionKeyMetadata = "partition_key"

// marshaler converts between Watermill messages and Kafka records, as the
// package documentation ("Plain producers and metadata") describes.
//
// Unmarshal never fails. watermill-kafka treats an unmarshal error as fatal
// for the consumer session (subscriber.go: "resend will make no sense,
// stopping consumerGroupHandler"), which after the rebalance reads the same
// record again: one bad record would stop the partition for good.
type marshaler struct{}

var _ wkafka.MarshalerUnmarshaler = marshaler{}

// Marshal implements watermill-kafka's Marshaler.
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
		// A value Unmarshal wrote always parses. Anything else came from
		// elsewhere (a RabbitMQ header relayed to Kafka, say) and was never
		// a record's time, so there is no original day to keep: the record
		// gets the publish time. Failing the publish instead would turn one
		// odd header into a poison copy or an outbox row that can never be
		// published.
		if ts, err := parseTimestamp(v); err == nil {
			pm.Timestamp = ts
		}
	}
	return pm, nil
}

// parseTimestamp reads a kafka_timestamp value back into a record
// timestamp, accepting what Unmarshal writes and nothing Kafka cannot
// carry: Sarama takes a zero time for "stamp it now", and a time before
// 1970 would be sent as a negative, i.e. missing, timestamp.
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

// Unmarshal implements watermill-kafka's Unmarshaler.
func (marshaler) Unmarshal(rec *sarama.ConsumerMessage) (*message.Message, error) {
	return kafkarecord.KafkaMessage(rec.Topic, rec.Partition, rec.Offset, rec.Key, rec.Value, rec.Timestamp, rec.Headers,
		func(h *sarama.RecordHeader) (string, []byte, bool) {
			if h == nil {
				return "", nil, false
			}
			return string(h.Key), h.Value, true
		}), nil
}
