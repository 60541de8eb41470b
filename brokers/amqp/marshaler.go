package amqp

import (
	"errors"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/internal/amqpheader"
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
// fails. It lives in internal/amqpheader, which the dead-letter tooling
// shares, so both read a queue's headers alike.
func headerValueToString(v any) string { return amqpheader.ToString(v) }
