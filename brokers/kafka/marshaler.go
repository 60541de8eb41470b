package kafka

import (
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Metadata keys the adapter sets from the Kafka record on consume. They
// describe where and when this copy of the message was stored, so Marshal
// never publishes them as headers, and claimtx never derives a claim key from
// them by default (an offset changes when a message is republished).
const (
	// UUIDHeader is the header carrying the Watermill message UUID, shared
	// with watermill-kafka so either side can read the other's messages.
	UUIDHeader = wkafka.UUIDHeaderKey

	MetadataTopic     = "kafka_topic"     // the topic the record was read from
	MetadataPartition = "kafka_partition" // its partition, decimal
	MetadataOffset    = "kafka_offset"    // its offset, decimal
	MetadataKey       = "kafka_key"       // its key as a string; absent for a nil key
	// MetadataTimestamp is the record timestamp (producer create time, or
	// broker append time when the topic uses LogAppendTime), RFC 3339 with
	// nanoseconds in UTC; absent when the record has none. It is stable
	// across redeliveries of the same record, which is what a
	// retention rule based on event time needs.
	MetadataTimestamp = "kafka_timestamp"

	// PartitionKeyMetadata is the metadata key Marshal uses as the record
	// key, so messages with the same value land on the same partition and
	// keep their order. It is published as a header too.
	PartitionKeyMetadata = "partition_key"

	reservedPrefix = "kafka_"
)

// Marshaler converts between Watermill messages and Kafka records.
//
// Unmarshal never fails. watermill-kafka treats an unmarshal error as fatal
// for the consumer session (subscriber.go: "resend will make no sense,
// stopping consumerGroupHandler"), which after the rebalance reads the same
// record again: one bad record would stop the partition for good. Every
// header becomes a metadata entry (bytes copied as a string; of repeated
// keys the last wins); the UUID comes from the "_watermill_message_uuid"
// header and is generated when a plain producer did not set one; and the
// kafka_* keys above are always set by the adapter, replacing a header of
// the same name, because a retention rule must be able to trust them.
//
// Marshal publishes every metadata entry as a header except the kafka_*
// keys, adds the UUID header, and uses the partition_key entry, if any, as
// the record key.
type Marshaler struct{}

var _ wkafka.MarshalerUnmarshaler = Marshaler{}

// Marshal implements watermill-kafka's Marshaler.
func (Marshaler) Marshal(topic string, msg *message.Message) (*sarama.ProducerMessage, error) {
	headers := make([]sarama.RecordHeader, 0, len(msg.Metadata)+1)
	headers = append(headers, sarama.RecordHeader{Key: []byte(UUIDHeader), Value: []byte(msg.UUID)})
	for k, v := range msg.Metadata {
		if strings.HasPrefix(k, reservedPrefix) || k == UUIDHeader {
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
	return pm, nil
}

// Unmarshal implements watermill-kafka's Unmarshaler.
func (Marshaler) Unmarshal(rec *sarama.ConsumerMessage) (*message.Message, error) {
	var uuid string
	md := make(message.Metadata, len(rec.Headers)+5)
	for _, h := range rec.Headers {
		if h == nil {
			continue
		}
		if string(h.Key) == UUIDHeader {
			uuid = string(h.Value)
			continue
		}
		md[string(h.Key)] = string(h.Value)
	}
	if uuid == "" {
		uuid = watermill.NewUUID()
	}
	md[MetadataTopic] = rec.Topic
	md[MetadataPartition] = strconv.FormatInt(int64(rec.Partition), 10)
	md[MetadataOffset] = strconv.FormatInt(rec.Offset, 10)
	if rec.Key != nil {
		md[MetadataKey] = string(rec.Key)
	} else {
		delete(md, MetadataKey)
	}
	// Sarama turns Kafka's "no timestamp" (-1) into the zero time (plus the
	// record's delta within its batch); that is not an event time.
	if ts := rec.Timestamp; !ts.IsZero() && ts.UnixMilli() >= 0 {
		md[MetadataTimestamp] = ts.UTC().Format(time.RFC3339Nano)
	} else {
		delete(md, MetadataTimestamp)
	}
	msg := message.NewMessage(uuid, rec.Value)
	msg.Metadata = md
	return msg, nil
}
