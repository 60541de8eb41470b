package amqp

import (
	"errors"
	"strings"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/internal/amqpheader"
)

// Keys Marshal never publishes as headers. The amqp_* metadata entries
// (amqpheader's MessageID, Exchange, ...) are set from AMQP message
// properties on consume: they describe one delivery, and claimtx never
// derives a claim key from them by default: they change on republish and
// on dead-letter replay.
const (
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
		if strings.HasPrefix(k, reservedPrefix) || k == metadataRedelivered || k == amqpheader.UUIDHeader || k == headerDeliveryCount || k == headerAcquiredCount {
			continue
		}
		headers[k] = v
	}
	headers[amqpheader.UUIDHeader] = msg.UUID
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
	return amqpheader.ToMessage(d), nil
}
