package amqp

import "github.com/claimtx/claimtx/internal/amqpheader"

// Names the black-box tests use. They are unexported in the package API:
// users write metadata names as strings in key specs, and the rest is
// plumbing or a documented default.
const (
	MaxWindow             = 65535 // brokers.AMQPConfig's bound on Window
	UUIDHeader            = amqpheader.UUIDHeader
	MetadataMessageID     = amqpheader.MessageID
	MetadataCorrelationID = amqpheader.CorrelationID
	MetadataContentType   = amqpheader.ContentType
	MetadataTimestamp     = amqpheader.Timestamp
	MetadataExchange      = amqpheader.Exchange
	MetadataRoutingKey    = amqpheader.RoutingKey
	MetadataRedelivered   = metadataRedelivered
)

// Marshaler is the adapter's message converter.
type Marshaler = marshaler

// HeaderValueToString converts one AMQP header value to its metadata string.
var HeaderValueToString = amqpheader.ToString

// WatcherState is what the Subscriber's connection has read off
// watermill-amqp's connection watcher (see conn in dial.go): whether it is
// connected, and whether it has ended.
func WatcherState(s *Subscriber) (connected, stopped bool) {
	select {
	case <-s.conn.w.stopped:
		stopped = true
	default:
	}
	return s.conn.w.connected.Load(), stopped
}

// HeaderFrameSize is the length of the content header frame amqp091
// writes for a publishing.
var HeaderFrameSize = headerFrameSize
