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

// The built-in adapters' settings live here, not in their packages, so that
// a Config carries them while package brokers links no broker client. Each
// field's tags declare its YAML key, variable and default (internal/config).

// Queue types (AMQPConfig.QueueType).
const (
	amqpQueueTypeClassic = "classic"
	amqpQueueTypeQuorum  = "quorum"
)

// AMQPConfig configures the RabbitMQ adapter (brokers/amqp, whose package
// documentation tells the topology and what each setting does). Every zero
// field takes its default; the URL is redacted whenever it is printed.
type AMQPConfig struct {
	// URL is the AMQP URI (amqp:// or amqps://, credentials and vhost
	// included). Defaults to "amqp://guest:guest@127.0.0.1:5672/".
	URL string `yaml:"url" env:"AMQP_URL,secret" default:"amqp://guest:guest@127.0.0.1:5672/"`
	// Concurrency is how many messages one Subscribe call processes at
	// once, one subscription (and channel) each. Defaults to 4.
	Concurrency int `yaml:"concurrency" env:"CONCURRENCY,positive" default:"4"`
	// Prefetch is the QoS prefetch count of every subscription channel;
	// above 1 it only parks messages other instances could take. Defaults to 1.
	Prefetch int `yaml:"prefetch" env:"AMQP_PREFETCH,positive" default:"1"`
	// Window, when > 0 (at most 65535), replaces Concurrency and Prefetch:
	// one consumer per Subscribe holds up to Window unacked messages (for a
	// batch consumer, workers × batch size). Defaults to 0.
	Window int `yaml:"window" env:"AMQP_WINDOW,positive"`
	// NackDelay holds a nacked delivery before it goes back to RabbitMQ,
	// which would redeliver it at once, in a tight loop. Negative: no
	// delay. Defaults to 1s.
	NackDelay time.Duration `yaml:"nack_delay" env:"AMQP_NACK_DELAY" default:"1s"`
	// DialTimeout bounds the start-up connection attempts. Negative: a
	// single attempt. Defaults to 30s.
	DialTimeout time.Duration `yaml:"dial_timeout" env:"AMQP_DIAL_TIMEOUT" default:"30s"`
	// ReconnectInitialInterval is the first wait between connection
	// attempts, at start-up and after a connection drops. Defaults to 500ms.
	ReconnectInitialInterval time.Duration `yaml:"reconnect_initial_interval" default:"500ms"`
	// ReconnectMaxInterval caps that wait. Defaults to 10s.
	ReconnectMaxInterval time.Duration `yaml:"reconnect_max_interval" default:"10s"`
	// PublishChannels is the size of the publisher's pool of confirm-mode
	// channels. Defaults to 4.
	PublishChannels int `yaml:"publish_channels" default:"4"`
	// QueueType is the type of every queue the adapter declares: "classic"
	// or "quorum" (replicated, the one for durable work). Defaults to
	// "classic", which declares no x-queue-type, so older queues keep working.
	QueueType string `yaml:"queue_type" env:"AMQP_QUEUE_TYPE" default:"classic"`
	// DeliveryLimit, when > 0, is the quorum queue's x-delivery-limit; keep
	// it well above the restarts a message may live through. Defaults to
	// 0: none set (RabbitMQ 4 then applies its default of 20).
	DeliveryLimit int `yaml:"delivery_limit" env:"AMQP_DELIVERY_LIMIT,positive"`
	// QueueArguments are passed to every queue declaration, for example
	// {"x-dead-letter-exchange": "dlx"}, and must equal those of an
	// existing queue. Defaults to none.
	QueueArguments map[string]any `yaml:"queue_arguments"`
	// ConnectionName tells connections apart in RabbitMQ's management UI.
	// Defaults to "claimtx".
	ConnectionName string `yaml:"connection_name" default:"claimtx"`
}

// The adapter applies the same defaults (defaults.Apply).
func init() { defaults.Register(config.Defaults[AMQPConfig]) }

// Validate reports the first field that cannot be used as a
// *framework.ConfigError named by its YAML key ("url"). Zero fields are valid.
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
	uriErr := amqpURIError(c.URL, u)
	_, typeArg := c.QueueArguments["x-queue-type"]
	_, limitArg := c.QueueArguments["x-delivery-limit"]
	return firstError(
		when(u.Scheme != "amqp" && u.Scheme != "amqps", "url", "scheme must be amqp or amqps, got %q", u.Scheme),
		when(uriErr != nil, "url", "not a valid AMQP URI %s: %v", config.RedactURL(c.URL), uriErr),
		when(c.Concurrency < 0, "concurrency", "must be positive, got %d", c.Concurrency),
		// RabbitMQ's default channel_max is 2047 per connection.
		when(c.Concurrency > 1024, "concurrency", "must be at most %d (one AMQP channel each), got %d", 1024, c.Concurrency),
		when(c.Prefetch < 0, "prefetch", "must be positive, got %d", c.Prefetch),
		when(c.Window < 0, "window", "must not be negative (0 disables the window mode), got %d", c.Window),
		// amqp091's Channel.Qos truncates the prefetch count to uint16 without a word.
		when(c.Window > 65535, "window", "must be at most %d (the AMQP prefetch count is 16 bits), got %d", 65535, c.Window),
		when(c.ReconnectInitialInterval < 0, "reconnect_initial_interval", "must not be negative, got %s", c.ReconnectInitialInterval),
		when(c.ReconnectMaxInterval < c.ReconnectInitialInterval, "reconnect_max_interval", "must be at least reconnect_initial_interval (%s), got %s", c.ReconnectInitialInterval, c.ReconnectMaxInterval),
		when(c.PublishChannels < 0, "publish_channels", "must be positive, got %d", c.PublishChannels),
		when(c.QueueType != amqpQueueTypeClassic && c.QueueType != amqpQueueTypeQuorum, "queue_type", "must be %q or %q, got %q", amqpQueueTypeClassic, amqpQueueTypeQuorum, c.QueueType),
		when(c.DeliveryLimit < 0, "delivery_limit", "must not be negative (0: no limit set), got %d", c.DeliveryLimit),
		when(c.DeliveryLimit > 0 && c.QueueType != amqpQueueTypeQuorum, "delivery_limit", "is a quorum queue setting: set queue_type (AMQP_QUEUE_TYPE) to %q, or leave delivery_limit unset (classic queues have no delivery limit)", amqpQueueTypeQuorum),
		// Each setting has one name. Whether queue_arguments encode as an
		// AMQP table is brokers/amqp's check: it needs the client's encoder.
		when(typeArg, "queue_arguments", "%q is set with %s, not in queue_arguments", "x-queue-type", "queue_type"),
		when(limitArg, "queue_arguments", "%q is set with %s, not in queue_arguments", "x-delivery-limit", "delivery_limit"),
	)
}

// String prints the config with the URL's password redacted.
func (c AMQPConfig) String() string { return config.Format(c) }

// GoString makes %#v redact too.
func (c AMQPConfig) GoString() string { return "brokers.AMQPConfig" + c.String() }

// amqpURIError is what amqp091.ParseURI refuses in a URL that url.Parse
// took, with amqp091's messages, so that validating links no AMQP client.
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
		if _, err := strconv.Atoi(q.Get(name)); q.Has(name) && err != nil {
			return fmt.Errorf("%s is not an integer: %w", name, err)
		}
	}
	if _, err := strconv.ParseUint(q.Get("channel_max"), 10, 16); q.Has("channel_max") && err != nil {
		return fmt.Errorf("connection_timeout is not an integer: %w", err) // sic: amqp091's message
	}
	return nil
}

// fieldErr is a *framework.ConfigError for field (its YAML key within the
// section) with a formatted reason.
func fieldErr(field, format string, args ...any) *framework.ConfigError {
	return &framework.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// when is fieldErr if broken, else nil: one rule of a Validate.
func when(broken bool, field, format string, args ...any) *framework.ConfigError {
	if !broken {
		return nil
	}
	return fieldErr(field, format, args...)
}

// firstError is the first of errs that is not nil, or nil.
func firstError(errs ...*framework.ConfigError) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
