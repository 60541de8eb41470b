package amqp

import (
	"errors"
	"fmt"
	"strings"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
)

// declareError turns a declaration refused because the queue exists with
// other arguments (406 PRECONDITION_FAILED, "inequivalent arg") into a
// *framework.ConfigError naming the setting and the two ways out, wrapping
// RabbitMQ's error (which names both values). Other errors pass as they
// are.
func declareError(c brokers.AMQPConfig, queue string, err error) error {
	var aerr *amqp091.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp091.PreconditionFailed || !strings.Contains(aerr.Reason, "inequivalent arg") {
		return err
	}
	field, setting := "queue_arguments", "queue_arguments"
	switch {
	case strings.Contains(aerr.Reason, "'"+argQueueType+"'"):
		field, setting = "queue_type", "queue_type (AMQP_QUEUE_TYPE)"
	case strings.Contains(aerr.Reason, "'"+argDeliveryLimit+"'"):
		field, setting = "delivery_limit", "delivery_limit (AMQP_DELIVERY_LIMIT)"
	}
	return &framework.ConfigError{
		Field: field,
		Reason: fmt.Sprintf("queue %q already exists with other arguments than this configuration declares "+
			"(queue_type %q, delivery_limit %d, queue_arguments %v), and RabbitMQ cannot change them in place: "+
			"either set %s to what the queue has, or migrate the queue: stop its consumers, let it drain "+
			"(or move its messages elsewhere), delete it (rabbitmqctl delete_queue %s) and start the consumers "+
			"with the new configuration, which declares it anew; RabbitMQ says",
			queue, c.QueueType, c.DeliveryLimit, c.QueueArguments, setting, queue),
		Err: err,
	}
}
