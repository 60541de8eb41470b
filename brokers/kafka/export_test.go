package kafka

import (
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/claimtx/claimtx/internal/kafkarecord"
)

// Names the black-box tests use. They are unexported in the package API:
// users write metadata names as strings in key specs.
const (
	MetadataTopic     = kafkarecord.KafkaTopic
	MetadataPartition = kafkarecord.KafkaPartition
	MetadataOffset    = kafkarecord.KafkaOffset
	MetadataKey       = kafkarecord.KafkaKey
	MetadataTimestamp = kafkarecord.KafkaTimestamp
	UUIDHeader        = wkafka.UUIDHeaderKey
)

// Marshaler is the adapter's record converter.
type Marshaler = marshaler
