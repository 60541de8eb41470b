// Package brokermeta holds the metadata keys that claimtx's broker adapters
// write and other packages read, so that framework and middleware need not
// import a broker adapter to know them.
package brokermeta

// KafkaTimestamp is the metadata key under which claimtx's Kafka adapter
// (brokers/kafka.MetadataTimestamp) exposes the record timestamp; the
// "kafka:timestamp" event-time spec reads it.
const KafkaTimestamp = "kafka_timestamp"
