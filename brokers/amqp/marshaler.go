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
	// uuidHeader is the header carrying the Watermill message UUID, shared with
	// watermill-amqp so either side can read the other's messages.
	uuidHeader = wamqp.DefaultMessageUUIDHeaderKey

	metadataMessageID     = "amqp_message_id"     // the message-id property
	metadataCorrelationID = "amqp_correlation_id" // the correlation-id property
	metadataContentType   = "amqp_content_type"   // the content-type property
	metadataTimestamp     = "amqp_timestamp"      // the timestamp property, RFC 3339 (UTC); absent when unset
	metadataExchange      = "amqp_exchange"       // the exchange the message was published to ("" = default)
	metadataRoutingKey    = "amqp_routing_key"    // the routing key it was published with

	// metadataRedelivered is set to "true" by watermill-amqp when RabbitMQ
	// flags the delivery as redelivered.
	metadataRedelivered = wamqp.MetadataRedeliveredKey

	// reservedPrefix marks keys that Marshal drops.
	reservedPrefix = "amqp_"

	// headerDeliveryCount and headerAcquiredCount are the headers a quorum
	// queue sets on its deliveries: how often the message came back to
	// that queue so far (x-acquired-count, from RabbitMQ 4.3: how often a
	// consumer took it). They are the delivering queue's state, not the
	// message's, so Marshal drops them like the amqp_ entries: a copy
	// published elsewhere (the poison queue) starts from its own count,
	// and a classic queue, which keeps headers as they are, does not
	// report returns that never happened there.
	headerDeliveryCount = "x-delivery-count"
	headerAcquiredCount = "x-acquired-count"
)

// errClosedDelivery is what Unmarshal returns for the zero amqp091.Delivery.
var errClosedDelivery = errors.New("brokers/amqp: zero delivery (consumer channel closed)")

// marshaler converts between Watermill messages and AMQP messages, as the
// package documentation ("Headers and dead-letter replay", "Metadata")
// describes. Unlike watermill-amqp's DefaultMarshaler it accepts any AMQP
// header type, so messages from plain producers and from dead-letter
// queues are consumed instead of being nacked and requeued forever.
type marshaler struct{}

var _ wamqp.Marshaler = marshaler{}

// Marshal implements watermill-amqp's Marshaler.
func (marshaler) Marshal(msg *message.Message) (amqp091.Publishing, error) {
	headers := make(amqp091.Table, len(msg.Metadata)+1)
	for k, v := range msg.Metadata {
		if strings.HasPrefix(k, reservedPrefix) || k == metadataRedelivered || k == uuidHeader || k == headerDeliveryCount || k == headerAcquiredCount {
			continue
		}
		headers[k] = v
	}
	headers[uuidHeader] = msg.UUID
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
func (marshaler) Unmarshal(d amqp091.Delivery) (*message.Message, error) {
	if d.Acknowledger == nil {
		return nil, errClosedDelivery
	}
	uuid := headerString(d.Headers[uuidHeader])
	if uuid == "" {
		uuid = d.MessageId
	}
	if uuid == "" {
		uuid = watermill.NewUUID()
	}
	msg := message.NewMessage(uuid, d.Body)
	msg.Metadata = make(message.Metadata, len(d.Headers)+4)
	for k, v := range d.Headers {
		if k == uuidHeader {
			continue
		}
		msg.Metadata[k] = headerValueToString(v)
	}
	setIfAbsent := func(k, v string) {
		if _, ok := msg.Metadata[k]; !ok {
			msg.Metadata[k] = v
		}
	}
	if d.MessageId != "" {
		setIfAbsent(metadataMessageID, d.MessageId)
	}
	if d.CorrelationId != "" {
		setIfAbsent(metadataCorrelationID, d.CorrelationId)
	}
	if d.ContentType != "" {
		setIfAbsent(metadataContentType, d.ContentType)
	}
	if !d.Timestamp.IsZero() {
		setIfAbsent(metadataTimestamp, d.Timestamp.UTC().Format(time.RFC3339Nano))
	}
	setIfAbsent(metadataExchange, d.Exchange)
	setIfAbsent(metadataRoutingKey, d.RoutingKey)
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

// headerValueToString converts one AMQP header value to its metadata
// string, following the mapping in the package documentation. It never
// fails.
func headerValueToString(v any) string {
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
