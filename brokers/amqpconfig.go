package brokers

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/claimtx/claimtx/brokers/internal/defaults"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/config"
)

// The settings of the built-in adapters (AMQPConfig, KafkaConfig,
// NATSConfig) live here, not in their packages, so that a Config can carry
// them while package brokers links no broker client. They are the one name
// of each adapter's configuration: brokers/amqp, brokers/kafka and
// brokers/nats take them as they are, with no alias of their own. Each
// field's tags declare its YAML key, its variable and its default once
// (see internal/config).

// Queue types (AMQPConfig.QueueType).
const (
	amqpQueueTypeClassic = "classic"
	amqpQueueTypeQuorum  = "quorum"
)

// Queue arguments that AMQPConfig.QueueType and AMQPConfig.DeliveryLimit set. They
// are refused in QueueArguments, so each setting has one name.
const (
	amqpArgQueueType     = "x-queue-type"
	amqpArgDeliveryLimit = "x-delivery-limit"
)

// amqpMaxConcurrency bounds Concurrency: every unit is an AMQP channel, and
// RabbitMQ's default channel_max is 2047 per connection.
const amqpMaxConcurrency = 1024

// amqpMaxWindow bounds Window: it becomes the channel's QoS prefetch count, a
// 16-bit field in AMQP 0-9-1 (amqp091's Channel.Qos takes an int and
// truncates it to uint16 without a word).
const amqpMaxWindow = 65535

// AMQPConfig configures the RabbitMQ adapter. The zero value is usable: every
// zero field takes the default named in its documentation.
//
// The topology is fixed on purpose: one durable queue per topic, named exactly
// like the topic, reached through the default exchange with routing key =
// topic. A plain producer that publishes to "" with routing key "orders" is
// therefore consumed by a subscription to topic "orders" with no binding to
// set up. Fan-out to several consumers is the producer side's topology
// (an exchange bound to several queues), not this adapter's concern.
type AMQPConfig struct {
	// URL is the AMQP URI (amqp:// or amqps://, credentials and vhost
	// included). It is redacted whenever the config is printed.
	// Defaults to "amqp://guest:guest@127.0.0.1:5672/".
	URL string `yaml:"url" env:"AMQP_URL,secret" default:"amqp://guest:guest@127.0.0.1:5672/"`

	// Concurrency is how many messages one Subscribe call processes at once.
	// Each Watermill AMQP subscription handles one delivery at a time, so the
	// adapter opens Concurrency subscriptions (each on its own channel) on
	// the same queue and merges them into one output channel. RabbitMQ then
	// spreads deliveries round-robin across them. Not used when Window > 0.
	// Defaults to 4.
	Concurrency int `yaml:"concurrency" env:"CONCURRENCY,positive" default:"4"`

	// Prefetch is the QoS prefetch count of every subscription channel. A
	// subscription only ever works on one delivery at a time, so anything
	// above 1 only parks messages in this process's buffers where other
	// instances cannot take them, and hands them back (redelivered) on a
	// crash. Raise it only to hide network latency on high-RTT links. Not
	// used when Window > 0. Defaults to 1.
	Prefetch int `yaml:"prefetch" env:"AMQP_PREFETCH,positive" default:"1"`

	// Window, when > 0, makes each Subscribe call consume with ONE amqp091
	// consumer on its own channel with QoS prefetch = Window, and forward
	// deliveries without waiting for earlier ones to be acked, so up to
	// Window messages are in flight at once (for a batch consumer,
	// consumer.NewBatch, set it to workers × batch size). Concurrency and
	// Prefetch are then not used.
	// Each delivery is acked on the channel it came from; a nacked one keeps
	// its place in the window while NackDelay runs, without holding up the
	// others. When the channel or the connection is lost, its unacked
	// deliveries go back to the queue (late acks of them have no effect) and
	// the consumer resumes on a new channel once reconnected. At most 65535
	// (the prefetch count is 16 bits). 0 (the default) keeps the
	// per-subscription mode.
	Window int `yaml:"window" env:"AMQP_WINDOW,positive"`

	// NackDelay is how long a nacked delivery is held before it is handed back
	// to RabbitMQ. watermill-amqp nacks with requeue=true, and RabbitMQ puts
	// the message back at the head of the queue at once, so without a delay a
	// message that keeps failing spins the CPU and floods the logs. While the
	// delay runs, that one subscription takes no other message (with Window,
	// only that message's window slot stays taken). The router's
	// Retry and Poison middleware make nacks rare (a nack means even the
	// poison queue could not be written). A negative value disables the
	// delay. Defaults to 1s.
	NackDelay time.Duration `yaml:"nack_delay" env:"AMQP_NACK_DELAY" default:"1s"`

	// DialTimeout bounds the start-up connection attempts. watermill-amqp
	// fails NewSubscriber/NewPublisher at once when RabbitMQ is not up yet;
	// this adapter retries with backoff (ReconnectInitialInterval doubling up
	// to ReconnectMaxInterval) until the connection succeeds, the context
	// passed to NewSubscriber/NewPublisher ends, or DialTimeout
	// has passed. Authentication and vhost errors are not retried. A negative
	// value means a single attempt. Defaults to 30s.
	DialTimeout time.Duration `yaml:"dial_timeout" env:"AMQP_DIAL_TIMEOUT" default:"30s"`

	// ReconnectInitialInterval is the first wait between connection attempts,
	// both at start-up and when an established connection drops (the latter
	// is watermill-amqp's reconnect loop, which retries forever).
	// Defaults to 500ms.
	ReconnectInitialInterval time.Duration `yaml:"reconnect_initial_interval" default:"500ms"`

	// ReconnectMaxInterval caps the wait between connection attempts.
	// Defaults to 10s.
	ReconnectMaxInterval time.Duration `yaml:"reconnect_max_interval" default:"10s"`

	// PublishChannels is the size of the publisher's channel pool. Publisher
	// confirms are always on (Publish returns only once RabbitMQ has taken
	// responsibility for the message); without a pool every Publish would open
	// a channel, put it in confirm mode and close it again. Defaults to 4.
	PublishChannels int `yaml:"publish_channels" default:"4"`

	// QueueType is the type of every queue the adapter declares (the
	// topic's, and the poison topic's when published to): "classic" or
	// "quorum", RabbitMQ's replicated queue type and the one to use for
	// durable work (classic mirrored queues are gone in RabbitMQ 4). A
	// queue's type is fixed when it is created: a queue that exists with
	// another type makes Subscribe and Publish fail with a
	// *framework.ConfigError that says how to migrate (see the package
	// documentation, "Quorum queues"). "classic" declares no x-queue-type
	// argument, so queues created before this setting keep working.
	// Defaults to "classic".
	QueueType string `yaml:"queue_type" env:"AMQP_QUEUE_TYPE" default:"classic"`

	// DeliveryLimit, when > 0, is the quorum queue's x-delivery-limit: a
	// message returned to the queue (nacked, or left unacked by a consumer
	// that died or lost its connection) more than DeliveryLimit times is
	// dropped by RabbitMQ, or dead-lettered when QueueArguments name an
	// x-dead-letter-exchange. claimtx's own poison path acts long before:
	// a failing message is retried in process and poisoned with the reason
	// on one delivery. Keep it well above the restarts a message may live
	// through. Only with QueueType "quorum". Defaults to 0: no limit set
	// (RabbitMQ 3.x: none; RabbitMQ 4.x: its default of 20).
	DeliveryLimit int `yaml:"delivery_limit" env:"AMQP_DELIVERY_LIMIT,positive"`

	// QueueArguments are passed to every queue declaration, for example
	// {"x-dead-letter-exchange": "dlx"}. x-queue-type and x-delivery-limit
	// are set with QueueType and DeliveryLimit, not here. They must equal
	// the arguments of an already existing queue, or RabbitMQ refuses the
	// declaration (PRECONDITION_FAILED) and the subscription fails with a
	// *framework.ConfigError saying so. Nested maps are converted to AMQP
	// tables. Defaults to none.
	QueueArguments map[string]any `yaml:"queue_arguments"`

	// ConnectionName is shown by RabbitMQ (management UI, rabbitmqctl
	// list_connections client_properties) to tell connections apart.
	// Defaults to "claimtx".
	ConnectionName string `yaml:"connection_name" default:"claimtx"`
}

// The adapter applies the same defaults (defaults.Apply), those of the
// fields' tags, without an exported method for it.
func init() { defaults.Register(config.Defaults[AMQPConfig]) }

// Validate reports the first field that cannot be used, as a
// *framework.ConfigError.
// Zero fields are valid: they take their defaults. Field names are the YAML
// keys ("url", "concurrency"); Config.Validate prefixes them with
// "amqp.".
func (c AMQPConfig) Validate() error {
	c = config.Defaults(c)

	u, err := url.Parse(c.URL)
	if err != nil {
		// Never print err: url.Error quotes the whole URL, password included.
		var uerr *url.Error
		reason := "not a valid URL"
		if errors.As(err, &uerr) {
			reason = "not a valid URL: " + uerr.Err.Error()
		}
		return &framework.ConfigError{Field: "url", Reason: reason}
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return fieldErr("url", "scheme must be amqp or amqps, got %q", u.Scheme)
	}
	if err := amqpURIError(c.URL, u); err != nil {
		return fieldErr("url", "not a valid AMQP URI %s: %v", config.RedactURL(c.URL), err)
	}
	switch {
	case c.Concurrency < 0:
		return fieldErr("concurrency", "must be positive, got %d", c.Concurrency)
	case c.Concurrency > amqpMaxConcurrency:
		return fieldErr("concurrency", "must be at most %d (one AMQP channel each), got %d", amqpMaxConcurrency, c.Concurrency)
	case c.Prefetch < 0:
		return fieldErr("prefetch", "must be positive, got %d", c.Prefetch)
	case c.Window < 0:
		return fieldErr("window", "must not be negative (0 disables the window mode), got %d", c.Window)
	case c.Window > amqpMaxWindow:
		return fieldErr("window", "must be at most %d (the AMQP prefetch count is 16 bits), got %d", amqpMaxWindow, c.Window)
	case c.ReconnectInitialInterval < 0:
		return fieldErr("reconnect_initial_interval", "must not be negative, got %s", c.ReconnectInitialInterval)
	case c.ReconnectMaxInterval < c.ReconnectInitialInterval:
		return fieldErr("reconnect_max_interval", "must be at least reconnect_initial_interval (%s), got %s", c.ReconnectInitialInterval, c.ReconnectMaxInterval)
	case c.PublishChannels < 0:
		return fieldErr("publish_channels", "must be positive, got %d", c.PublishChannels)
	}
	switch {
	case c.QueueType != amqpQueueTypeClassic && c.QueueType != amqpQueueTypeQuorum:
		return fieldErr("queue_type", "must be %q or %q, got %q", amqpQueueTypeClassic, amqpQueueTypeQuorum, c.QueueType)
	case c.DeliveryLimit < 0:
		return fieldErr("delivery_limit", "must not be negative (0: no limit set), got %d", c.DeliveryLimit)
	case c.DeliveryLimit > 0 && c.QueueType != amqpQueueTypeQuorum:
		return fieldErr("delivery_limit", "is a quorum queue setting: set queue_type (AMQP_QUEUE_TYPE) to %q, or leave delivery_limit unset (classic queues have no delivery limit)", amqpQueueTypeQuorum)
	}
	for _, arg := range []struct{ name, field string }{{amqpArgQueueType, "queue_type"}, {amqpArgDeliveryLimit, "delivery_limit"}} {
		if _, ok := c.QueueArguments[arg.name]; ok {
			return fieldErr("queue_arguments", "%q is set with %s, not in queue_arguments", arg.name, arg.field)
		}
	}
	// Whether queue_arguments encode as an AMQP table is the adapter's
	// check (it needs the client's table encoder): see brokers/amqp.
	return nil
}

// String prints the config with the URL's password redacted.
func (c AMQPConfig) String() string { return config.Format(c) }

// amqpURIError is what amqp091.ParseURI refuses in a URL that url.Parse
// took, with amqp091's messages, checked here so that validating links no
// AMQP client.
func amqpURIError(raw string, u *url.URL) error {
	if strings.Contains(raw, " ") {
		return errors.New("URI must not contain whitespace")
	}
	if p := u.Port(); p != "" {
		if _, err := strconv.ParseInt(p, 10, 32); err != nil {
			return err
		}
	}
	q := u.Query()
	for _, name := range []string{"heartbeat", "connection_timeout"} {
		if q.Has(name) {
			if _, err := strconv.Atoi(q.Get(name)); err != nil {
				return fmt.Errorf("%s is not an integer: %w", name, err)
			}
		}
	}
	if q.Has("channel_max") {
		if _, err := strconv.ParseUint(q.Get("channel_max"), 10, 16); err != nil {
			return fmt.Errorf("connection_timeout is not an integer: %w", err) // sic: amqp091's message
		}
	}
	return nil
}

// GoString makes %#v redact too.
func (c AMQPConfig) GoString() string { return "brokers.AMQPConfig" + c.String() }

// fieldErr is a *framework.ConfigError for field (its YAML key within the
// adapter's section) with a formatted reason.
func fieldErr(field, format string, args ...any) *framework.ConfigError {
	return &framework.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
