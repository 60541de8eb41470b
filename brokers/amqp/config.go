package amqp

import (
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/internal/defaults"
	"github.com/claimtx/claimtx/framework"
)

// The adapter is configured with brokers.AMQPConfig, which package brokers
// holds so that a brokers.Config can carry it without linking this
// adapter's client: it is the one name of the adapter's settings.

// The values of brokers.AMQPConfig.QueueType and the queue arguments they set.
const (
	queueTypeQuorum  = "quorum"
	argQueueType     = "x-queue-type"
	argDeliveryLimit = "x-delivery-limit"
)

// withDefaults is c with every zero field at its documented default.
func withDefaults(c brokers.AMQPConfig) brokers.AMQPConfig { return defaults.Apply(c) }

// validate is brokers.AMQPConfig.Validate plus the check that needs the client: that
// the queue arguments encode as an AMQP table.
func validate(c brokers.AMQPConfig) error {
	if err := c.Validate(); err != nil {
		return err
	}
	return checkQueueArguments("queue_arguments", c.QueueArguments)
}

// checkQueueArguments is the check only the client can make: that the
// queue arguments encode as an AMQP table. field names them in the error.
func checkQueueArguments(field string, args map[string]any) error {
	if _, err := queueArguments(args); err != nil {
		return &framework.ConfigError{Field: field, Reason: "cannot be encoded as an AMQP table", Err: err}
	}
	return nil
}

// watermillConfig maps c (defaults applied) onto watermill-amqp's durable
// queue topology: default exchange, queue = topic, routing key = topic.
func watermillConfig(c brokers.AMQPConfig) (wamqp.Config, error) {
	args, err := declareArguments(c)
	if err != nil {
		return wamqp.Config{}, err
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
		// amqp091.Dial's default. With a brokers.AMQPConfig, zero means the server's
		// value (RabbitMQ: 60s), and a connection lost without a close
		// (network partition, host gone) is noticed after three missed
		// heartbeats: 30s here instead of 3 minutes, during which
		// Subscriber.IsConnected, and readiness, would still say "up".
		Heartbeat: 10 * time.Second,
		// One attempt must not outlive the start-up budget: amqp091's own
		// default is 30s per dial against a black-holed address.
		Dial: amqp091.DefaultDial(attemptTimeout(c)),
	}
	return wc, nil
}

func attemptTimeout(c brokers.AMQPConfig) time.Duration {
	const max = 10 * time.Second
	if c.DialTimeout > 0 && c.DialTimeout < max {
		return c.DialTimeout
	}
	return max
}

// declareArguments is the argument table of every queue declaration:
// QueueArguments plus x-queue-type and x-delivery-limit from QueueType and
// DeliveryLimit. A classic queue gets no x-queue-type, as before the
// setting existed: RabbitMQ compares the arguments of a redeclaration with
// the queue's, and older releases do not take an explicit "classic" as
// equal to none.
func declareArguments(c brokers.AMQPConfig) (amqp091.Table, error) {
	args, err := queueArguments(c.QueueArguments)
	if err != nil {
		return nil, err
	}
	if c.QueueType == queueTypeQuorum {
		if args == nil {
			args = amqp091.Table{}
		}
		args[argQueueType] = queueTypeQuorum
		if c.DeliveryLimit > 0 {
			args[argDeliveryLimit] = int64(c.DeliveryLimit)
		}
	}
	return args, nil
}

// queueArguments converts YAML-decoded arguments (nested map[string]any,
// []any, int) into an amqp091.Table and checks that RabbitMQ can encode it.
func queueArguments(in map[string]any) (amqp091.Table, error) {
	if len(in) == 0 {
		return nil, nil
	}
	t := make(amqp091.Table, len(in))
	for k, v := range in {
		t[k] = toAMQPValue(v)
	}
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
	case uint:
		return int64(x)
	case uint32:
		return int64(x)
	case uint64:
		return int64(x)
	default:
		return v
	}
}
