package kafkarecord

import (
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Metadata keys the Kafka adapter sets from a record, and watermill-kafka's
// UUID header.
const (
	KafkaUUIDHeader = "_watermill_message_uuid"
	KafkaTopic      = "kafka_topic"     // the topic the record was read from
	KafkaPartition  = "kafka_partition" // its partition, decimal
	KafkaOffset     = "kafka_offset"    // its offset, decimal
	KafkaKey        = "kafka_key"       // its key as a string; absent for a nil key
	KafkaTimestamp  = "kafka_timestamp" // read by the "kafka:timestamp" event-time spec
)

// KafkaMessage is a record as the Kafka adapter hands it to a consumer,
// whichever client read it: the UUID from its header, else a new one; the
// other headers as metadata; the kafka_* keys from the record, which win
// over headers. header returns one header's key and value, or false.
func KafkaMessage[H any](topic string, partition int32, offset int64, key, value []byte, ts time.Time, headers []H, header func(H) (string, []byte, bool)) *message.Message {
	var uuid string
	md := make(message.Metadata, len(headers)+5)
	for _, h := range headers {
		k, v, ok := header(h)
		if !ok {
			continue
		}
		if k == KafkaUUIDHeader {
			uuid = string(v)
			continue
		}
		md[k] = string(v)
	}
	if uuid == "" {
		uuid = watermill.NewUUID()
	}
	md[KafkaTopic] = topic
	md[KafkaPartition] = strconv.FormatInt(int64(partition), 10)
	md[KafkaOffset] = strconv.FormatInt(offset, 10)
	delete(md, KafkaKey)
	if key != nil {
		md[KafkaKey] = string(key)
	}
	// Sarama turns Kafka's "no timestamp" (-1) into the zero time (plus the
	// record's delta within its batch); that is not an event time.
	delete(md, KafkaTimestamp)
	if !ts.IsZero() && ts.UnixMilli() >= 0 {
		md[KafkaTimestamp] = ts.UTC().Format(time.RFC3339Nano)
	}
	msg := message.NewMessage(uuid, value)
	msg.Metadata = md
	return msg
}
