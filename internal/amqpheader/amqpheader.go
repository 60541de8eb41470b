// Package amqpheader converts an AMQP delivery to the message brokers/amqp
// hands a consumer (its package documentation, "Headers and metadata"), for
// the adapter and the dead-letter tooling, which reads poison queues with
// amqp091 directly: a key spec must derive the same key from both.
package amqpheader

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// ToString converts one AMQP header value to its metadata string. It never
// fails.
func ToString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		if utf8.Valid(x) {
			return string(x)
		}
	}
	b, _ := json.Marshal(jsonValue(v)) // cannot fail: jsonValue leaves only what JSON encodes
	return string(b)
}

// jsonValue rewrites a decoded AMQP value into one encoding/json renders
// predictably.
func jsonValue(v any) any {
	switch x := v.(type) {
	case nil, bool, string, int8, uint8, int16, uint16, int32, uint32, int64, int:
		return x
	case float32:
		return jsonFloat(float64(x), 32)
	case float64:
		return jsonFloat(x, 64)
	case []byte:
		return base64.StdEncoding.EncodeToString(x)
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case amqp091.Decimal:
		return map[string]any{"scale": x.Scale, "value": x.Value}
	case amqp091.Table:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = jsonValue(e)
		}
		return m
	case map[string]any:
		return jsonValue(amqp091.Table(x))
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonValue(e)
		}
		return out
	default:
		return fmt.Sprint(x)
	}
}

func jsonFloat(f float64, bits int) any {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	}
	// json.Number keeps float32 values short ("0.1", not "0.10000000149").
	return json.Number(strconv.FormatFloat(f, 'g', -1, bits))
}

// Metadata keys set from AMQP message properties, and watermill-amqp's
// UUID header.
const (
	UUIDHeader    = wamqp.DefaultMessageUUIDHeaderKey
	MessageID     = "amqp_message_id"     // the message-id property
	CorrelationID = "amqp_correlation_id" // the correlation-id property
	ContentType   = "amqp_content_type"   // the content-type property
	Timestamp     = "amqp_timestamp"      // the timestamp property, RFC 3339 (UTC); absent when unset
	Exchange      = "amqp_exchange"       // the exchange the message was published to ("" = default)
	RoutingKey    = "amqp_routing_key"    // the routing key it was published with
)

// ToMessage is d as the adapter hands it to a consumer: the UUID from its
// header, else the message-id, else a new one; other headers through
// ToString; the properties under the amqp_* keys unless a header has that
// name.
func ToMessage(d amqp091.Delivery) *message.Message {
	uuid, _ := d.Headers[UUIDHeader].(string)
	if b, ok := d.Headers[UUIDHeader].([]byte); ok {
		uuid = string(b)
	}
	msg := message.NewMessage(cmp.Or(uuid, d.MessageId, watermill.NewUUID()), d.Body)
	msg.Metadata = make(message.Metadata, len(d.Headers)+6)
	for k, v := range d.Headers {
		if k != UUIDHeader {
			msg.Metadata[k] = ToString(v)
		}
	}
	var ts string
	if !d.Timestamp.IsZero() {
		ts = d.Timestamp.UTC().Format(time.RFC3339Nano)
	}
	for _, p := range []struct {
		key, value string
		always     bool // set even when empty
	}{
		{MessageID, d.MessageId, false}, {CorrelationID, d.CorrelationId, false}, {ContentType, d.ContentType, false},
		{Timestamp, ts, false}, {Exchange, d.Exchange, true}, {RoutingKey, d.RoutingKey, true},
	} {
		if _, taken := msg.Metadata[p.key]; !taken && (p.value != "" || p.always) {
			msg.Metadata[p.key] = p.value
		}
	}
	return msg
}
