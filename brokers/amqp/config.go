package amqp

import (
	"context"
	"reflect"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
)

// Importing the package registers the "amqp" kind: a program that never
// imports it does not link the AMQP client.
func init() {
	brokers.Register(brokers.KindAMQP, brokers.Factory{
		NewSubscriber: func(c brokers.Config, l watermill.LoggerAdapter) (message.Subscriber, error) {
			return NewSubscriber(context.Background(), c.AMQP, l)
		},
		NewPublisher: func(c brokers.Config, l watermill.LoggerAdapter) (message.Publisher, error) {
			return NewPublisher(context.Background(), c.AMQP, l)
		},
		Validate: func(c brokers.Config) error {
			return checkQueueArguments("amqp.queue_arguments", c.AMQP.QueueArguments)
		},
	})
}

// The values of brokers.AMQPConfig.QueueType and the queue arguments they set.
const (
	queueTypeQuorum  = "quorum"
	argQueueType     = "x-queue-type"
	argDeliveryLimit = "x-delivery-limit"
)

func validate(c brokers.AMQPConfig) error {
	if err := c.Validate(); err != nil {
		return err
	}
	return checkQueueArguments("queue_arguments", c.QueueArguments)
}

// checkQueueArguments is the check only the client can make: that the
// queue arguments encode as an AMQP table.
func checkQueueArguments(field string, args map[string]any) error {
	if _, err := queueArguments(args); err != nil {
		return &framework.ConfigError{Field: field, Reason: "cannot be encoded as an AMQP table", Err: err}
	}
	return nil
}

// watermillConfig maps c (defaults applied) onto watermill-amqp's durable
// queue topology.
func watermillConfig(c brokers.AMQPConfig) (wamqp.Config, error) {
	args, err := declareArguments(c)
	if err != nil {
		return wamqp.Config{}, err
	}
	// amqp091's default is 30s per dial to a black-holed address.
	attemptTimeout := 10 * time.Second
	if c.DialTimeout > 0 {
		attemptTimeout = min(c.DialTimeout, attemptTimeout)
	}
	wc := wamqp.NewDurableQueueConfig(c.URL)
	wc.Marshaler = marshaler{}
	wc.Queue.Arguments = args
	wc.Publish.ConfirmDelivery = true
	wc.Publish.ChannelPoolSize = c.PublishChannels
	wc.Connection.Reconnect = &wamqp.ReconnectConfig{
		BackoffInitialInterval:     c.ReconnectInitialInterval,
		BackoffRandomizationFactor: 0.5,
		BackoffMultiplier:          2,
		BackoffMaxInterval:         c.ReconnectMaxInterval,
	}
	props := amqp091.NewConnectionProperties()
	props.SetClientConnectionName(c.ConnectionName)
	wc.Connection.AmqpConfig = &amqp091.Config{
		Properties: props,
		// amqp091.Dial's default; zero here would take RabbitMQ's 60s, and
		// a silently lost connection would look up (readiness) for 3
		// minutes instead of 30s.
		Heartbeat: 10 * time.Second,
		Dial:      amqp091.DefaultDial(attemptTimeout),
	}
	return wc, nil
}

// declareArguments is the argument table of every queue declaration. A
// classic queue gets no x-queue-type: older RabbitMQ releases do not take
// an explicit "classic" as equal to none when a queue is redeclared.
func declareArguments(c brokers.AMQPConfig) (amqp091.Table, error) {
	args, err := queueArguments(c.QueueArguments)
	if err != nil {
		return nil, err
	}
	if c.QueueType == queueTypeQuorum {
		args[argQueueType] = queueTypeQuorum
		if c.DeliveryLimit > 0 {
			args[argDeliveryLimit] = int64(c.DeliveryLimit)
		}
	}
	return args, nil
}

// queueArguments converts YAML-decoded arguments into an amqp091.Table
// RabbitMQ can encode.
func queueArguments(in map[string]any) (amqp091.Table, error) {
	t := toAMQPValue(in).(amqp091.Table) // a Table even for no arguments
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return t, nil
}

func toAMQPValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		t := make(amqp091.Table, len(x))
		for k, e := range x {
			t[k] = toAMQPValue(e)
		}
		return t
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = toAMQPValue(e)
		}
		return out
	case uint, uint32, uint64:
		return int64(reflect.ValueOf(x).Uint())
	default:
		return v
	}
}
