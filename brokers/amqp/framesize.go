package amqp

import (
	"fmt"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/framework"
)

// frameOverhead is what a frame adds to its payload: type, channel, size
// and the frame-end octet. RabbitMQ refuses a frame longer than the
// negotiated frame_max (131072 by default) with FRAME_ERROR
// frame_too_large and closes the connection.
const frameOverhead = 8

// checkFrameSize refuses, as a framework.Permanent error, a message whose
// properties do not fit in one frame of frameMax bytes (0: no limit).
// A body is split over as many frames as it needs, but every property,
// headers included, travels in the one content header frame, and a frame
// over the limit makes RabbitMQ close the whole connection: every publish
// in flight on it fails, the publisher reconnects, and the same message
// does it again on its next attempt. Refused here it fails alone, and the
// error says why (a poisoned copy is then published smaller, or kept in
// the dead-letter table; see middleware.Poison).
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

// headerFrameSize is the length of the payload of the content header frame
// amqp091 writes for p (headerFrame.write in its write.go): class, weight,
// body size, property flags, then each property that is set.
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

// shortstrSize is what amqp091's writeShortstr writes: a length octet and
// at most 255 bytes (it writes len mod 256).
func shortstrSize(s string) int { return 1 + int(uint8(len(s))) }

// tableSize is the length of a table's entries, as writeTable writes them
// after their 4-byte length.
func tableSize(t amqp091.Table) int {
	n := 0
	for k, v := range t {
		n += shortstrSize(k) + fieldSize(v)
	}
	return n
}

// fieldSize mirrors amqp091's writeField: a type octet and the value. A type
// it cannot write counts as nothing here: the publish fails on it anyway.
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
