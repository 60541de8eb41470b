package amqp

import (
	"fmt"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/framework"
)

// frameOverhead is what a frame adds to its payload: type, channel, size
// and the frame-end octet.
const frameOverhead = 8

// checkFrameSize refuses, as a framework.Permanent error, a message whose
// properties do not fit in one frame of frameMax bytes (0: no limit). The
// body may span frames, but all properties travel in one header frame, and
// one over frame_max makes RabbitMQ close the whole connection, failing
// every publish on it, again on each retry. Refused here it fails alone.
func checkFrameSize(p amqp091.Publishing, frameMax int, uuid string) error {
	if frameMax <= 0 {
		return nil
	}
	if n := headerFrameSize(p); n > frameMax-frameOverhead {
		return framework.Permanent(fmt.Errorf(
			"brokers/amqp: the properties and headers of message %s take %d bytes, more than a frame holds (frame_max %d): RabbitMQ would close the connection (FRAME_ERROR frame_too_large)",
			uuid, n, frameMax))
	}
	return nil
}

// headerFrameSize is the payload length of the content header frame amqp091
// writes for p: class, weight, body size, property flags, then each
// property set.
func headerFrameSize(p amqp091.Publishing) int {
	n := 2 + 2 + 8 + 2
	for _, s := range []string{p.ContentType, p.ContentEncoding, p.CorrelationId, p.ReplyTo, p.Expiration, p.MessageId, p.Type, p.UserId, p.AppId} {
		if s != "" {
			n += shortstrSize(s)
		}
	}
	if len(p.Headers) > 0 {
		n += 4 + tableSize(p.Headers)
	}
	if p.DeliveryMode > 0 {
		n++
	}
	if p.Priority > 0 {
		n++
	}
	if !p.Timestamp.IsZero() {
		n += 8
	}
	return n
}

// shortstrSize is what amqp091's writeShortstr writes (len mod 256 bytes).
func shortstrSize(s string) int { return 1 + int(uint8(len(s))) }

// tableSize is the length of a table's entries, without their 4-byte length.
func tableSize(t amqp091.Table) int {
	n := 0
	for k, v := range t {
		n += shortstrSize(k) + fieldSize(v)
	}
	return n
}

// fieldSize mirrors amqp091's writeField; a type it cannot write counts 0,
// as the publish fails on it anyway.
func fieldSize(v any) int {
	switch v := v.(type) {
	case bool, byte, int8:
		return 2
	case int16:
		return 3
	case int, int32, float32:
		return 5
	case int64, float64, time.Time:
		return 9
	case amqp091.Decimal:
		return 6
	case string:
		return 5 + len(v)
	case []byte:
		return 5 + len(v)
	case []any:
		n := 5
		for _, e := range v {
			n += fieldSize(e)
		}
		return n
	case amqp091.Table:
		return 1 + 4 + tableSize(v)
	case nil:
		return 1
	}
	return 0
}
