package amqp

import (
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/internal/amqpheader"
)

// MaxWindow is brokers.AMQPConfig's bound on Window.
const MaxWindow = 65535

// Marshaler is the adapter's message converter.
type Marshaler = marshaler

// HeaderValueToString converts one AMQP header value to its metadata string.
var HeaderValueToString = amqpheader.ToString

// WatcherState is what the Subscriber's connection has read off
// watermill-amqp's connection watcher (see conn in dial.go): whether it is
// connected, and whether it has ended.
func WatcherState(sub message.Subscriber) (connected, stopped bool) {
	s := sub.(*subscriber)
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

// Subscriber and Publisher are what NewSubscriber and NewPublisher return.
type (
	Subscriber = subscriber
	Publisher  = publisher
)
