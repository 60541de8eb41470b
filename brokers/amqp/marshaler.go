package amqp

import (
	"errors"
	"strings"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/internal/amqpheader"
)

// Keys Marshal never publishes: they describe one delivery. The quorum
// queue's counts are the delivering queue's state, not the message's: a
// copy elsewhere starts from its own count (and a classic queue, which
// keeps headers as they are, would report returns that never happened).
const (
	metadataRedelivered = wamqp.MetadataRedeliveredKey
	reservedPrefix      = "amqp_" // amqpheader's property keys
	headerDeliveryCount = "x-delivery-count"
	headerAcquiredCount = "x-acquired-count"
)

var errClosedDelivery = errors.New("brokers/amqp: zero delivery (consumer channel closed)")

// marshaler converts between Watermill and AMQP messages (package
// documentation, "Headers and metadata").
type marshaler struct{}

var _ wamqp.Marshaler = marshaler{}

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

// Unmarshal fails only for the zero Delivery, which watermill-amqp reads
// from a closed delivery channel: it would reach the handler empty.
func (marshaler) Unmarshal(d amqp091.Delivery) (*message.Message, error) {
	if d.Acknowledger == nil {
		return nil, errClosedDelivery
	}
	return amqpheader.ToMessage(d), nil
}
