package amqp

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// Metadata keys the adapter sets from AMQP message properties on consume.
// They describe one delivery, so Marshal never publishes them as headers, and
// claimtx never derives a claim key from them by default: they change on
// republish and on dead-letter replay.
const (
	// UUIDHeader is the header carrying the Watermill message UUID, shared with
	// watermill-amqp so either side can read the other's messages.
	UUIDHeader = wamqp.DefaultMessageUUIDHeaderKey

	MetadataMessageID     = "amqp_message_id"     // the message-id property
	MetadataCorrelationID = "amqp_correlation_id" // the correlation-id property
	MetadataContentType   = "amqp_content_type"   // the content-type property
	MetadataTimestamp     = "amqp_timestamp"      // the timestamp property, RFC 3339 (UTC); absent when unset
	MetadataExchange      = "amqp_exchange"       // the exchange the message was published to ("" = default)
	MetadataRoutingKey    = "amqp_routing_key"    // the routing key it was published with

	// MetadataRedelivered is set to "true" by watermill-amqp when RabbitMQ
	// flags the delivery as redelivered.
	MetadataRedelivered = wamqp.MetadataRedeliveredKey

	// reservedPrefix marks keys that Marshal drops.
	reservedPrefix = "amqp_"
)

// errClosedDelivery is what Unmarshal returns for the zero amqp091.Delivery.
var errClosedDelivery = errors.New("brokers/amqp: zero delivery (consumer channel closed)")

// Marshaler converts between Watermill messages and AMQP messages. Unlike
// watermill-amqp's DefaultMarshaler it accepts any AMQP header type, so
// messages from plain producers and from dead-letter queues are consumed
// instead of being nacked and requeued forever.
//
// Header to metadata mapping (Unmarshal):
//
//   - string: copied as is.
//   - []byte (AMQP byte array): copied as is when it is valid UTF-8, otherwise
//     JSON-encoded (a quoted base64 string).
//   - anything else (bool, integers, floats, Decimal, timestamp, void, nested
//     tables and arrays such as RabbitMQ's x-death): its JSON encoding, so
//     json.Unmarshal(metadata[key]) gives the value back. Within JSON, tables
//     are objects, arrays are arrays, timestamps are RFC 3339 strings, []byte
//     is base64, Decimal is {"scale":s,"value":v}, and the floats NaN, +Inf
//     and -Inf, which JSON cannot hold, are the strings "NaN", "+Inf", "-Inf".
//     Example: an int64 header 3 becomes "3", a bool becomes "true", and
//     x-death becomes `[{"count":1,"exchange":"",...}]`.
//
// The UUID comes from the "_watermill_message_uuid" header, then from the
// message-id property, and is generated when neither is set (a plain
// producer). The message properties message-id, correlation-id, content-type
// and timestamp, and the exchange and routing key, are added under the
// amqp_* keys above without overwriting a header of the same name.
//
// Marshal publishes every metadata entry as a string header except the
// amqp_* keys and the redelivered flag (they describe the delivery that
// was consumed, not the new message), sets the UUID header and the
// message-id property to the message UUID, and marks the message
// persistent. A value that Unmarshal JSON-encoded goes back out as that JSON
// string: Marshal does not guess types back.
type Marshaler struct{}

var _ wamqp.Marshaler = Marshaler{}

// Marshal implements watermill-amqp's Marshaler.
func (Marshaler) Marshal(msg *message.Message) (amqp091.Publishing, error) {
	headers := make(amqp091.Table, len(msg.Metadata)+1)
	for k, v := range msg.Metadata {
		if strings.HasPrefix(k, reservedPrefix) || k == MetadataRedelivered || k == UUIDHeader {
			continue
		}
		headers[k] = v
	}
	headers[UUIDHeader] = msg.UUID
	return amqp091.Publishing{
		Headers:      headers,
		MessageId:    msg.UUID,
		DeliveryMode: amqp091.Persistent,
		Body:         msg.Payload,
	}, nil
}

// Unmarshal implements watermill-amqp's Marshaler. It fails only for the zero
// Delivery: watermill-amqp reads from the delivery channel after amqp091 has
// closed it (its select does not check for a closed channel), and without this
// check an empty message would reach the handler.
func (Marshaler) Unmarshal(d amqp091.Delivery) (*message.Message, error) {
	if d.Acknowledger == nil {
		return nil, errClosedDelivery
	}
	uuid := headerString(d.Headers[UUIDHeader])
	if uuid == "" {
		uuid = d.MessageId
	}
	if uuid == "" {
		uuid = watermill.NewUUID()
	}
	msg := message.NewMessage(uuid, d.Body)
	msg.Metadata = make(message.Metadata, len(d.Headers)+4)
	for k, v := range d.Headers {
		if k == UUIDHeader {
			continue
		}
		msg.Metadata[k] = HeaderValueToString(v)
	}
	setIfAbsent := func(k, v string) {
		if _, ok := msg.Metadata[k]; !ok {
			msg.Metadata[k] = v
		}
	}
	if d.MessageId != "" {
		setIfAbsent(MetadataMessageID, d.MessageId)
	}
	if d.CorrelationId != "" {
		setIfAbsent(MetadataCorrelationID, d.CorrelationId)
	}
	if d.ContentType != "" {
		setIfAbsent(MetadataContentType, d.ContentType)
	}
	if !d.Timestamp.IsZero() {
		setIfAbsent(MetadataTimestamp, d.Timestamp.UTC().Format(time.RFC3339Nano))
	}
	setIfAbsent(MetadataExchange, d.Exchange)
	setIfAbsent(MetadataRoutingKey, d.RoutingKey)
	return msg, nil
}

func headerString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	default:
		return ""
	}
}

// HeaderValueToString converts one AMQP header value to its metadata string,
// following the mapping documented on Marshaler. It never fails.
func HeaderValueToString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		if utf8.Valid(x) {
			return string(x)
		}
	}
	b, err := json.Marshal(jsonValue(v))
	if err != nil {
		// jsonValue only produces JSON-encodable values; this is a guard for
		// a type amqp091 may add one day, not an expected path.
		b, _ = json.Marshal(fmt.Sprint(v))
	}
	return string(b)
}

// jsonValue rewrites a decoded AMQP value into something encoding/json
// accepts without error and renders predictably.
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
