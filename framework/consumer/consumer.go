package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmetrics "github.com/ThreeDotsLabs/watermill/components/metrics"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/internal/metrics"
	"github.com/claimtx/claimtx/framework/observe"
	"github.com/claimtx/claimtx/internal/committedkeys"
	"github.com/claimtx/claimtx/internal/config"
	"github.com/claimtx/claimtx/internal/poison"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// Defaults for Config fields left zero, documented on the fields.
const (
	defaultHandlerRetries       = 3
	defaultRetryInitialInterval = 100 * time.Millisecond
	defaultPoisonSuffix         = ".poison"
)

// Config describes one claimtx consumer.
type Config struct {
	// Name is the consumer name stored with every claim ("loyalty").
	// Required.
	Name string
	// Topic is consumed: a RabbitMQ durable queue of that name, or a Kafka
	// topic. Required.
	Topic string
	// Key is a key spec resolved with Extractors, such as
	// "template:order-completed:{payload.order_id}". Claim.Key, a
	// framework.KeyFunc, is the alternative in code; one of the two is
	// required (neither in middleware.ModeNaturalKey), and setting both is
	// a ConfigError.
	Key string
	// EventTime is an event-time spec resolved with Extractors, such as
	// "json:occurred_at" (see framework.ParseTimeSpec): the spec form of
	// Claim.EventTime, for configuration files and the environment, as
	// Key is of Claim.Key. Setting both is a ConfigError. What the event
	// time is used for is documented on Claim below. Defaults to "": none.
	EventTime string

	// Pool runs the claim transactions. Defaults to a pool opened from
	// DatabaseURL (and closed by Close).
	Pool *pgxpool.Pool
	// DatabaseURL is used when Pool is nil.
	DatabaseURL string
	// Store names claimtx's schema and tables. Defaults to store.Config{}.
	Store store.Config
	// Broker selects and configures the broker: one of the kinds linked
	// into the program (the adapters it imports, and your own registered
	// with brokers.Register), so BROKER can name them. Defaults to
	// brokers' defaults (RabbitMQ on localhost).
	Broker brokers.Config
	// Extractors resolves Key: a registry holding your own key extractors
	// (framework.Registry.RegisterKey), so a spec can name them. Defaults
	// to the built-in extractors.
	Extractors *framework.Registry

	// Claim configures the claim middleware, with middleware.Claim's
	// fields and defaults: Key (the code alternative to the Key spec
	// above), KeyPolicy, Mode, OutboxTopic, Isolation, SynchronousCommit
	// (with remote_write or remote_apply, the consumer checks at start-up
	// and every 30s that the server has a synchronous standby, and warns in
	// its log and its readiness report while it has none), MaxClaimWait,
	// MaxAttempts, InitialBackoff, MaxBackoff, EventTime,
	// AllowBrokerEventTime, Fingerprint, PoisonMemo (the consumer records
	// the memos, in both modes), CommittedKeys, CommittedKeysTTL (capped
	// at half of Retention, see there) and OnRetry (called besides the metrics'
	// hook). The consumer fills the rest, so New and NewBatch
	// refuse them with a ConfigError: Claim.Store (use Pool or
	// DatabaseURL, and Store), Claim.Consumer (use Name), Claim.Logger
	// (use Logger) and Claim.OnOutcome (use OnOutcome: the claim's hook
	// runs once per attempt, OnOutcome once per message).
	//
	// Claim.EventTime feeds the expiry guard (see Retention) and, only
	// when the claim table is partitioned by event day
	// (store.PreparePartitioning; restart consumers after preparing), the
	// claim. An EventTime the broker or publishing client assigns to each
	// copy, such as "kafka:timestamp", is refused for a partitioned claim
	// table unless Claim.AllowBrokerEventTime is set (see
	// middleware.Claim.AllowBrokerEventTime for what it risks). The expiry
	// guard accepts such a time without it, because the guard is better
	// than none, but it shares the weakness: a copy stamped anew looks
	// young, so a replay older than Retention whose claim cleanup already
	// removed is applied again instead of poisoned as expired.
	//
	// A ConfigError about one of these fields names it "Claim.<field>".
	Claim middleware.Claim
	// Retention, with Claim.EventTime, puts a middleware.ExpiryGuard
	// before the claim: a message whose event time is older than
	// Retention can no longer be checked against a claim that cleanup may
	// have removed, so it is poisoned with outcome Expired instead of
	// applied. Use the window given to cleanup or partition maintenance.
	//
	// With Retention set, the consumer also compares it, at start-up and
	// hourly, with the broker's replay horizon: how old a message of Topic
	// or PoisonTopic can be when the broker still delivers it (Kafka:
	// retention.ms, unbounded when -1 or compacted; RabbitMQ: the queue's
	// x-message-ttl, else unbounded; NATS: the stream's max_age, else
	// unbounded). A horizon beyond the retention is
	// logged at WARN with both numbers, shown as a warning in the
	// readiness report (still ready) and exported as
	// claimtx_claim_retention_seconds and claimtx_replay_horizon_seconds.
	//
	// Retention also caps the committed-key cache: a Claim.CommittedKeysTTL
	// above half of it is a ConfigError, and the default TTL is lowered to
	// half of it when that is shorter.
	//
	// Defaults to 0: no guard, no comparison.
	Retention time.Duration
	// StrictRetentionHorizon makes New fail with a ConfigError on
	// Retention when the broker's replay horizon exceeds it, instead of
	// warning. Defaults to false.
	StrictRetentionHorizon bool

	// HandlerRetries bounds how often a message whose handler failed (an
	// error, a panic, a HandlerTimeout) is retried in process, with
	// exponential backoff, before it is poisoned; in both modes alike.
	// Permanent errors are poisoned without a retry. Transient database
	// failures are not retried here: the claim already retried them
	// (Claim.MaxAttempts), and the message is nacked. Defaults to 3.
	HandlerRetries int
	// RetryInitialInterval is the first backoff of HandlerRetries.
	// Defaults to 100ms.
	RetryInitialInterval time.Duration
	// DrainTimeout bounds a graceful shutdown (the context given to Run
	// ends, or Close is called): no new message starts, the messages in
	// flight get this long to commit and be acked, then whatever has not
	// finished is cancelled, rolls back and goes back to the broker
	// (nacked). Work cut short is never poisoned. Closing the broker
	// clients after that takes at most 5 s more (whatever they are doing:
	// joining a group, a hung request, an unreachable broker), and the
	// cancelled work up to 5 s if a handler ignores its context: Run
	// returns within DrainTimeout + 10 s. A shutdown that comes while the
	// consumer is still subscribing lets the subscription finish first,
	// for up to 5 s; one that comes during New makes New return at once.
	// Keep it below your orchestrator's grace period (Kubernetes: 30 s)
	// minus those seconds. Defaults to 15 s.
	DrainTimeout time.Duration
	// PoisonTopic receives messages that cannot be processed, with the
	// reason in metadata. Defaults to Topic + ".poison".
	PoisonTopic string

	// StartupTimeout bounds how long New and NewBatch wait for each
	// dependency at start-up: PostgreSQL (connecting and migrating) and,
	// when set, the broker (it then replaces Broker.AMQP.DialTimeout,
	// Broker.Kafka.DialTimeout and Broker.NATS.DialTimeout). A dependency
	// not reachable yet, or starting or shutting down (a failover), is
	// retried with backoff and
	// each wait is logged at WARN with the dependency and its last error;
	// when the time is up, start-up fails with that error. Authentication
	// failures are never retried: they fail at once with a
	// *framework.AuthError. Negative: one attempt. Defaults to
	// 30 s for the database; left zero, the broker keeps its own
	// DialTimeout (default also 30 s). See docs/operations.md.
	StartupTimeout time.Duration

	// HandlerTimeout bounds one attempt at a message: the claim
	// transaction with its claim wait, handler, commit and transient
	// retries. When it passes, the attempt's context ends, the transaction
	// rolls back, and the message fails with a *HandlerTimeoutError
	// (errors.As); Retry tries it again with a fresh deadline, then Poison
	// dead-letters it with the reason. The handler must honour its context
	// (every call on the claim's pgx.Tx does): Go cannot stop code that
	// ignores it. Keep it above Claim.MaxClaimWait, or twins waiting behind
	// a slow original time out. See timeout.go. Defaults to 0: no timeout.
	HandlerTimeout time.Duration

	// OnOutcome is called once per message, when it is acked or nacked,
	// with its final outcome: Applied or Duplicate (acked after the
	// commit), Poisoned or Expired (acked after a copy went to the poison
	// topic or, when the broker refused it, to the dead-letter table) or
	// Failed (nacked; it comes back). In-process retries are not
	// outcomes: the Result is the last attempt's, and they are counted in
	// claimtx_retries_total{cause="handler"}. Messages handed back
	// unprocessed at shutdown are not reported.
	OnOutcome func(middleware.Result)
	// Registerer, when set, receives claimtx's metrics (observe.NewMetrics)
	// and Watermill's router metrics. Defaults to no metrics.
	Registerer prometheus.Registerer
	// Tracer starts a span per claim transaction, continuing the
	// producer's trace. Defaults to otel.Tracer("claimtx"), a no-op until
	// an OpenTelemetry SDK is installed globally.
	Tracer trace.Tracer
	// Logger receives the router's and claimtx's logs. Defaults to
	// slog.Default().
	Logger *slog.Logger

	// names maps the fields LoadConfig set (by the names errors use:
	// "Topic", "Claim.MaxClaimWait", "key") to what the user wrote: the
	// YAML path or the environment variable. nil for a Config built in
	// code, whose errors keep the Go names.
	names map[string]string
}

func (c Config) validate() error {
	switch {
	case c.Topic == "":
		return &framework.ConfigError{Field: "Topic", Reason: "must not be empty"}
	case c.Claim.Key != nil && c.Key != "":
		return &framework.ConfigError{Field: "Key", Reason: "set Key (a spec) or Claim.Key (a KeyFunc), not both"}
	case c.Claim.Key == nil && c.Key == "" && c.Claim.Mode != middleware.ModeNaturalKey:
		return &framework.ConfigError{Field: "Key", Reason: "set Key (a spec such as metadata:event_id) or Claim.Key"}
	case c.Claim.EventTime != nil && c.EventTime != "":
		return &framework.ConfigError{Field: "EventTime", Reason: "set EventTime (a spec) or Claim.EventTime (a TimeFunc), not both"}
	case c.Pool == nil && c.DatabaseURL == "":
		return &framework.ConfigError{Field: "DatabaseURL", Reason: "set DatabaseURL or Pool"}
	case c.HandlerRetries < 0:
		return &framework.ConfigError{Field: "HandlerRetries", Reason: "must not be negative"}
	case c.HandlerTimeout < 0:
		return &framework.ConfigError{Field: "HandlerTimeout", Reason: "must not be negative"}
	case c.DrainTimeout < 0:
		return &framework.ConfigError{Field: "DrainTimeout", Reason: "must not be negative"}
	case c.Retention < 0:
		return &framework.ConfigError{Field: "Retention", Reason: "must not be negative"}
	case c.Retention > 0 && c.Claim.EventTime == nil && c.EventTime == "":
		// Checked before anything connects; New repeats it where it builds the guard.
		return &framework.ConfigError{Field: "EventTime", Reason: "Retention needs an event time (EventTime or Claim.EventTime) to tell a message's age"}
	case c.Retention > 0 && c.Claim.CommittedKeysTTL > c.Retention/2:
		return &framework.ConfigError{Field: "Claim.CommittedKeysTTL", Reason: fmt.Sprintf("%s is more than half of Retention (%s): a cached key could outlive its claim", c.Claim.CommittedKeysTTL, c.Retention)}
	case c.RetryInitialInterval < 0:
		return &framework.ConfigError{Field: "RetryInitialInterval", Reason: "must not be negative"}
	case c.Claim.PoisonMemo && c.Claim.Mode == middleware.ModeNaturalKey:
		// NewClaim refuses it too, but only once connected.
		return &framework.ConfigError{Field: "Claim.PoisonMemo", Reason: "not supported in ModeNaturalKey (see middleware.Claim.PoisonMemo)"}
	// What the consumer fills itself: a value set there would be
	// overwritten or bypass the consumer's bookkeeping.
	case c.Claim.Store != nil:
		return &framework.ConfigError{Field: "Claim.Store", Reason: "is the consumer's: set Pool or DatabaseURL, and Store"}
	case c.Claim.Consumer != "":
		return &framework.ConfigError{Field: "Claim.Consumer", Reason: "is the consumer's: set Name"}
	case c.Claim.Logger != nil:
		return &framework.ConfigError{Field: "Claim.Logger", Reason: "is the consumer's: set Logger"}
	case c.Claim.OnOutcome != nil:
		return &framework.ConfigError{Field: "Claim.OnOutcome", Reason: "is the consumer's: set OnOutcome, called once per message when it is acked or nacked (the claim's hook runs once per attempt)"}
	}
	if err := config.ValidateConsumer("Name", c.Name); err != nil {
		return err
	}
	if err := c.Store.Validate(); err != nil {
		return err
	}
	return c.Broker.Validate()
}

// Consumer is a running (or runnable) claimtx consumer, built by New (one
// message per claim transaction) or NewBatch (batches).
type Consumer struct {
	*parts
	router  *message.Router // New's
	drainer *drainer        // New's
	batches *batchRunner    // NewBatch's
}

// parts is what New and NewBatch build alike from a Config: the pool, the
// migrated store, the broker clients, the outcome reporting and the claim.
type parts struct {
	cfg       Config
	pool      *pgxpool.Pool
	ownsPool  bool
	store     *store.Store
	sub       message.Subscriber
	pub       message.Publisher
	wlog      watermill.LoggerAdapter
	metrics   *metrics.Metrics
	report    func(middleware.Result)
	claim     middleware.Claim
	health    observe.Health
	horizon   *horizon          // nil without Retention or a subscriber that knows its horizon
	standby   *durability       // nil unless Claim.SynchronousCommit needs a synchronous standby
	positions bool              // the subscriber starts partitions at the stored Kafka positions
	settled   *settledPositions // positions settled by acks, stored by watchPositions
	closeOnce sync.Once
	closeErr  error
	closeMore func() error // the router, for New

	// stop asks a running Run to shut down gracefully (Close does);
	// stopped is closed when Run has returned.
	stop, stopped chan struct{}
	stopOnce      sync.Once
	ran           bool
	runMu         sync.Mutex
}

// withDefaults returns c with the defaults of the fields open fills in
// (see each field), which String prints too.
func (c Config) withDefaults() Config {
	c.PoisonTopic = cmp.Or(c.PoisonTopic, c.Topic+defaultPoisonSuffix)
	c.HandlerRetries = cmp.Or(c.HandlerRetries, defaultHandlerRetries)
	c.RetryInitialInterval = cmp.Or(c.RetryInitialInterval, defaultRetryInitialInterval)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, defaultDrainTimeout)
	// One group per consumer: services on one topic each see all of it.
	c.Broker.Kafka.ConsumerGroup = cmp.Or(c.Broker.Kafka.ConsumerGroup, c.Name)
	if c.Broker.NATS.Durable == "" {
		// Likewise one JetStream durable per consumer, when the name is
		// one (c.Broker was valid, so only the durable can fail); else
		// the subscriber asks for NATS_DURABLE.
		named := c.Broker
		named.NATS.Durable = c.Name
		if named.Validate() == nil {
			c.Broker = named
		}
	}
	// One start-up bound for every dependency (see StartupTimeout).
	if c.StartupTimeout != 0 {
		c.Broker.AMQP.DialTimeout = c.StartupTimeout
		c.Broker.Kafka.DialTimeout = c.StartupTimeout
		c.Broker.NATS.DialTimeout = c.StartupTimeout
	}
	if half := c.Retention / 2; c.Retention > 0 && c.Claim.CommittedKeysTTL == 0 && half < committedkeys.DefaultTTL {
		c.Claim.CommittedKeysTTL = half
		if half <= 0 {
			c.Claim.CommittedKeys = -1 // no TTL short enough: no cache
		}
	}
	return c
}

// open validates cfg, applies its defaults, connects, migrates, and builds
// the claim (without EventTime, which New adds when the table claims by
// event day). On error everything opened is closed again.
func open(ctx context.Context, cfg Config) (_ *parts, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg = cfg.withDefaults()
	reg := cmp.Or(cfg.Extractors, framework.NewRegistry())
	keyFunc := cfg.Claim.Key
	if cfg.Key != "" {
		kf, err := reg.ParseKey(cfg.Key)
		if err != nil {
			return nil, err
		}
		keyFunc = kf
	}
	if cfg.EventTime != "" {
		tf, err := reg.ParseTime(cfg.EventTime)
		if err != nil {
			return nil, err
		}
		cfg.Claim.EventTime = tf
	}

	p := &parts{cfg: cfg, pool: cfg.Pool, stop: make(chan struct{}), stopped: make(chan struct{})}
	defer p.closeOnError(&err)
	if p.pool == nil {
		pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
		if err != nil {
			return nil, databaseURLError("DatabaseURL", cfg.DatabaseURL, err)
		}
		p.pool, p.ownsPool = pool, true
	}
	if p.store, err = store.New(p.pool, cfg.Store); err != nil {
		return nil, err
	}
	// Start-up policy (startup.go): wait for PostgreSQL up to
	// StartupTimeout, never retry an authentication failure.
	if err := awaitDatabase(ctx, cfg.Logger, cfg.StartupTimeout, p.pool, cfg.poolerField(), "migrate claimtx's schema", p.store.Migrate); err != nil {
		// Behind a transaction pooler it is the URL that is wrong,
		// reported like its other errors (databaseURLError).
		var ce *framework.ConfigError
		if errors.Is(err, store.ErrTransactionPooler) && errors.As(err, &ce) {
			return nil, cfg.named(ce)
		}
		return nil, err
	}
	if err := p.checkMemoPrivileges(ctx); err != nil {
		return nil, err
	}
	p.checkDeadLetterPrivileges(ctx)
	// Warn lets the brokers' start-up loops log what they wait for at WARN.
	p.wlog = newSlogAdapter(cfg.Logger)
	if p.sub, err = connectBroker(ctx, func() (message.Subscriber, error) { return brokers.NewSubscriber(cfg.Broker, p.wlog) }); err != nil {
		return nil, err
	}
	if p.pub, err = connectBroker(ctx, func() (message.Publisher, error) { return brokers.NewPublisher(cfg.Broker, p.wlog) }); err != nil {
		return nil, err
	}
	if err := declareQueues(cfg, p.sub); err != nil {
		return nil, err
	}
	if cfg.Registerer != nil {
		if p.metrics, err = metrics.New(cfg.Registerer); err != nil {
			return nil, err
		}
	}
	if p.positions, err = p.attachPositions(ctx); err != nil {
		return nil, err
	}
	// One Result per message, from the ledger (outcomes.go); spans,
	// which are per attempt, are annotated by the claim's hook in New.
	p.report = func(r middleware.Result) {
		if p.metrics != nil {
			p.metrics.OnOutcome(r)
		}
		if cfg.OnOutcome != nil {
			cfg.OnOutcome(r)
		}
	}
	p.claim = cfg.Claim
	p.claim.Store, p.claim.Consumer, p.claim.Key, p.claim.Logger = p.store, cfg.Name, keyFunc, p.wlog
	// OnOutcome: a ledger's, set by New or NewBatch. EventTime: set by
	// New when the table claims by event day.
	p.claim.EventTime = nil
	if userRetry := cfg.Claim.OnRetry; p.metrics != nil {
		p.claim.OnRetry = func(r middleware.TxRetry) {
			if userRetry != nil {
				userRetry(r)
			}
			p.metrics.OnRetry(r)
		}
	}
	p.health = observe.Health{Store: p.store, Broker: observe.SubscriberConnected(p.sub)}
	if p.horizon, err = newHorizon(ctx, p); err != nil {
		return nil, err
	}
	p.standby = newDurability(ctx, p)
	p.health.Warnings = p.warnings
	return p, nil
}

// warnings are the readiness report's warnings: the retention horizon's
// and the synchronous standby's findings.
func (p *parts) warnings() map[string]string {
	w := map[string]string{}
	if p.horizon != nil {
		maps.Copy(w, p.horizon.warnings())
	}
	if p.standby != nil {
		maps.Copy(w, p.standby.warnings())
	}
	return w
}

// declareQueues declares, on RabbitMQ, the topic's queue and the poison
// topic's, with the configured queue type and arguments, before anything
// is consumed. A queue that exists with other arguments (a classic poison
// queue left from before the move to quorum queues, say) then fails
// start-up with a *framework.ConfigError that says what to do, instead of
// failing the first poisoning, which would nack the message and have it
// redelivered until someone reads the log. Other kinds create their topics
// their own way and are left alone.
func declareQueues(cfg Config, sub message.Subscriber) error {
	if cfg.Broker.Kind != "" && cfg.Broker.Kind != brokers.KindAMQP {
		return nil
	}
	si, ok := sub.(message.SubscribeInitializer)
	if !ok {
		return nil
	}
	for _, topic := range []string{cfg.Topic, cfg.PoisonTopic} {
		if err := si.SubscribeInitialize(topic); err != nil {
			return err
		}
	}
	return nil
}

// poison is the consumer's Poison middleware: po (a caller's
// BatchOptions.Poison, or the zero value for cfg.PoisonTopic on cfg's
// broker) with the fields that stamp the copies and the dead-letter table
// filled where left empty, and hooks that tell l of each poisoned message
// (l reports it once the original is acked), record its memo and log
// refused copies, besides po's own. A copy the broker refuses goes to the
// store's dead-letter table.
func (p *parts) poison(l *ledger, po middleware.Poison) middleware.Poison {
	onPoison, onRefused := po.OnPoison, po.OnRefused
	if po.Publisher == nil {
		po.Publisher, po.Topic, onPoison = p.pub, p.cfg.PoisonTopic, p.logPoisoned
	}
	// Stamped on each copy, for `claimtx dlq`.
	po.Consumer, po.SourceTopic = cmp.Or(po.Consumer, p.cfg.Name), cmp.Or(po.SourceTopic, p.cfg.Topic)
	if po.Key == nil {
		po.Key = p.poisonKey()
	}
	po.DeadLetters = cmp.Or(po.DeadLetters, p.store)
	po.OnPoison = func(msg *message.Message, err error) {
		if onPoison != nil {
			onPoison(msg, err)
		}
		p.memoize(msg, err, l.poisoned(msg, err))
	}
	po.OnRefused = func(msg *message.Message, r middleware.PoisonRefusal) {
		if onRefused != nil {
			onRefused(msg, r)
		}
		p.logRefused(msg, r)
	}
	return po
}

// logPoisoned logs a poisoned message at WARN with its whole reason. This
// is the one line that has the whole text: the copy's reason is bounded
// (4 KiB), and a cut one ends with the hash logged here beside it, so the
// two can be matched. Once per poisoned delivery, never per retry or
// redelivery: every other log line bounds the error (slogAdapter.Error).
func (p *parts) logPoisoned(msg *message.Message, err error) {
	cfg := p.cfg
	reason := err.Error()
	args := []any{"consumer", cfg.Name, "topic", cfg.Topic, "poison_topic", cfg.PoisonTopic, "message_uuid", msg.UUID, "reason", reason}
	if _, cut := poison.BoundReason(reason, poison.MaxReasonBytes); cut {
		args = append(args, "reason_bytes", len(reason), "reason_sha256", poison.ReasonHash(reason))
	}
	cfg.Logger.Warn("claimtx: message poisoned", args...)
}

// logRefused logs and counts a poisoned copy the broker refused for good
// (middleware.Poison.OnRefused): at WARN when a smaller copy was
// published, at ERROR with the broker's error when the message went to the
// dead-letter table (once: the original is then acked) or nowhere (it is
// nacked and comes back).
func (p *parts) logRefused(msg *message.Message, r middleware.PoisonRefusal) {
	cfg := p.cfg
	args := []any{"consumer", cfg.Name, "topic", cfg.Topic, "poison_topic", cfg.PoisonTopic, "message_uuid", msg.UUID, "err", r.Err}
	n := p.names()
	table := n.Schema + "." + n.DeadLetter
	switch r.Fallback {
	case "smaller_copy":
		cfg.Logger.Warn("claimtx: the broker refused the poisoned copy; published a smaller one (reason cut to 256 bytes)", args...)
	case "dead_letter_table":
		cfg.Logger.Error("claimtx: the broker refused the poisoned copy; the message is recorded in the dead-letter table and acked",
			append(args, "dead_letter_table", table)...)
	default:
		cfg.Logger.Error("claimtx: the broker refused the poisoned copy and the dead-letter table could not record it; the message is nacked and comes back",
			append(args, "dead_letter_table", table)...)
	}
	if p.metrics != nil {
		p.metrics.OnPoisonRefused(cfg.Name, r.Fallback)
	}
}

// poisonKey is the claim's key function under the claim's key policy:
// the key a poisoned copy is stamped with is the one its claim would have
// (or has), so `claimtx dlq` can look the claim up. nil when the claim
// has no key function (natural-key mode without one).
func (p *parts) poisonKey() framework.KeyFunc {
	keyOf, policy := p.claim.Key, p.claim.KeyPolicy
	if keyOf == nil {
		return nil
	}
	return func(msg *message.Message) (string, error) {
		k, err := keyOf(msg)
		if err != nil {
			return "", err
		}
		return policy.Normalize(k)
	}
}

// New validates cfg, connects, migrates claimtx's schema and builds the
// router around handler. It does not consume until Run.
func New(ctx context.Context, cfg Config, handler middleware.TxHandlerFunc) (*Consumer, error) {
	c, err := newConsumer(ctx, cfg, handler)
	return c, cfg.named(err)
}

func newConsumer(ctx context.Context, cfg Config, handler middleware.TxHandlerFunc) (_ *Consumer, err error) {
	if handler == nil {
		return nil, &framework.ConfigError{Field: "handler", Reason: "must not be nil"}
	}
	p, err := open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer p.closeOnError(&err)
	cfg = p.cfg
	// The router's close comes after the drain (see consume): by then no
	// handler runs, and it only waits for the subscriptions to end.
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: routerCloseTimeout}, p.wlog)
	if err != nil {
		return nil, fmt.Errorf("claimtx: router: %w", err)
	}
	c := &Consumer{parts: p, router: router, drainer: newDrainer(cfg.Logger)}
	p.closeMore = router.Close
	if cfg.Registerer != nil {
		// Under claimtx's prefix, like claimtx's own metrics, rather than
		// Watermill's bare handler_execution_time_seconds, which another
		// router in the process would collide with.
		wmetrics.NewPrometheusMetricsBuilder(cfg.Registerer, "claimtx", "").AddPrometheusRouterMetrics(router)
	}
	// Claims carry the event day only when the table is prepared for (or
	// converted to) partitions by event day; EventTime alone may just feed
	// the expiry guard. Restart consumers after PreparePartitioning.
	claim := p.claim
	// The handler is registered under cfg.Name (AddConsumerHandler below).
	l := p.newLedger(cfg.Name)
	tracing := observe.Tracing{Tracer: cfg.Tracer}
	claim.OnOutcome = func(r middleware.Result) {
		tracing.OnOutcome(r) // the attempt's span
		l.claimed(r)
	}
	if cfg.Claim.EventTime != nil {
		byDay, err := p.store.ClaimsByEventDay(ctx)
		if err != nil {
			return nil, err
		}
		if byDay {
			claim.EventTime = cfg.Claim.EventTime
		}
	}
	claimMW, err := middleware.NewClaim(claim)
	if err != nil {
		return nil, claimFieldErr(err)
	}
	poisonMW, err := middleware.NewPoison(p.poison(l, middleware.Poison{}))
	if err != nil {
		return nil, err
	}
	retry := wmw.Retry{
		MaxRetries:      cfg.HandlerRetries,
		InitialInterval: cfg.RetryInitialInterval,
		MaxInterval:     10 * cfg.RetryInitialInterval,
		Multiplier:      2,
		ShouldRetry:     func(p wmw.RetryParams) bool { return retryable(p.Err) },
		Logger:          p.wlog,
	}
	// The drainer goes first: a message held back at shutdown must not
	// reach Poison, and cancelling the in-flight ones at the drain timeout
	// is what Poison recognises as an interruption. The ledger settles
	// what comes out of Recoverer: exactly what the router acks or nacks.
	router.AddMiddleware(c.drainer.middleware, l.middleware, wmw.Recoverer, poisonMW, retry.Middleware)
	h := router.AddConsumerHandler(cfg.Name, cfg.Topic, p.sub, middleware.TxHandler(handler))
	// HandlerTimeout sits inside Retry, so each retry gets a fresh deadline.
	if cfg.Retention > 0 {
		if cfg.Claim.EventTime == nil {
			return nil, &framework.ConfigError{Field: "Claim.EventTime", Reason: "Retention needs Claim.EventTime to tell a message's age"}
		}
		guard, err := middleware.NewExpiryGuard(middleware.ExpiryGuard{Retention: cfg.Retention, EventTime: cfg.Claim.EventTime})
		if err != nil {
			return nil, err
		}
		// Before the timeout and the claim: an expired message never
		// opens a transaction.
		h.AddMiddleware(guard)
	}
	h.AddMiddleware(handlerTimeout(cfg.HandlerTimeout), tracing.Middleware, claimMW)
	return c, nil
}

// Run consumes until ctx is cancelled or Close is called, then shuts down
// gracefully: no new message (or batch) starts, the ones in flight get
// Config.DrainTimeout to commit and be acked, the rest is cancelled and
// nacked, never poisoned (see Config.DrainTimeout). It returns once that
// is done.
func (c *Consumer) Run(ctx context.Context) error {
	if c.batches != nil {
		return c.run(ctx, c.batches.run)
	}
	return c.run(ctx, c.consume)
}

// consume runs the router until ctx ends, then drains. The router, and
// with it the broker subscriptions, runs on a context of its own: they must
// stay open while the in-flight messages drain, so that their acks still
// reach the broker.
func (c *Consumer) consume(ctx context.Context) error {
	runCtx, endSubscriptions := context.WithCancel(context.WithoutCancel(ctx))
	defer endSubscriptions()
	done := make(chan error, 1)
	go func() { done <- c.router.Run(runCtx) }()
	select {
	case err := <-done:
		// Stopped by itself: every subscription ended.
		c.drainer.release()
		return wrapRunErr(err)
	case <-ctx.Done():
	}
	// Stopped while still subscribing (a SIGTERM right after start): let
	// the router start its handler first. Watermill counts a handler from
	// the moment it is added, so a router closed before the handler started
	// waits out its whole CloseTimeout and leaves goroutines behind.
	// Bounded (startWaitMax): against a broker that is down, Subscribe
	// waits for its own dial timeout, and nothing is in flight to wait for.
	startWait := time.NewTimer(min(c.cfg.DrainTimeout, startWaitMax))
	defer startWait.Stop()
	select {
	case <-c.router.Running():
	case err := <-done:
		c.drainer.release()
		return wrapRunErr(err)
	case <-startWait.C:
	}
	c.drainer.drain(c.cfg.DrainTimeout, c.cfg.Logger)
	// The subscriptions end first, so what was held back goes back to the
	// broker without coming round to this consumer again.
	endSubscriptions()
	c.drainer.release()
	if err := c.router.Close(); err != nil {
		// Every message has been settled or handed back by now: what is
		// left is a subscriber slow to close (a Kafka client stuck on a
		// dead broker connection until its read timeout, say). That is
		// worth a line in the log, not a failed shutdown: what it has not
		// acked is redelivered.
		c.cfg.Logger.Warn("claimtx: the broker subscription did not close in time; shutting down anyway", "err", err)
		return nil
	}
	return wrapRunErr(<-done)
}

// claimFieldErr names a claim field of a *framework.ConfigError the way
// the user set it: Config.Claim's field.
func claimFieldErr(err error) error {
	var ce *framework.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	return &framework.ConfigError{Field: "Claim." + ce.Field, Reason: ce.Reason, Err: ce.Err}
}

// retryable says whether a failed message is worth another attempt in
// process: not when it is permanent (it is poisoned at once), and not when
// it is a transient database failure, which the claim already retried
// Claim.MaxAttempts times (retrying here again would multiply them).
func retryable(err error) bool {
	return !framework.IsPermanent(err) && !store.IsTransient(err)
}

// Running is closed once the consumer consumes: the subscription exists,
// so messages published from then on reach this consumer (a readiness
// signal).
func (c *Consumer) Running() chan struct{} {
	if c.batches != nil {
		return c.batches.running
	}
	return c.router.Running()
}

// Health returns the readiness check (database, migrations and, where the
// broker client reports it, the broker connection) as an http.Handler.
func (p *parts) Health() observe.Health { return p.health }

// Store returns the consumer's store.
func (p *parts) Store() *store.Store { return p.store }

// Pool returns the pool the claim transactions run on.
func (p *parts) Pool() *pgxpool.Pool { return p.pool }

// Publisher returns the publisher used for poisoned messages, built from
// the same broker configuration.
func (p *parts) Publisher() message.Publisher { return p.pub }

// closeOnError closes p when *err is set: a constructor that failed
// after open must not leave its connections behind.
func (p *parts) closeOnError(err *error) {
	if *err != nil {
		_ = p.Close()
	}
}

// Close stops consuming and releases the broker clients and, if it opened
// it, the pool.
func (p *parts) Close() error {
	p.closeOnce.Do(func() { p.closeErr = p.close() })
	return p.closeErr
}

// run is Run for both modes: it runs body once, with a context that also
// ends when Close is called, and records that it returned.
func (p *parts) run(ctx context.Context, body func(context.Context) error) error {
	p.runMu.Lock()
	if p.ran {
		p.runMu.Unlock()
		return errors.New("claimtx: Run called twice")
	}
	p.ran = true
	p.runMu.Unlock()
	defer close(p.stopped)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	if p.horizon != nil {
		go p.horizon.watch(ctx)
	}
	if p.standby != nil {
		go p.standby.watch(ctx)
	}
	go p.watchPositions(ctx)
	return body(ctx)
}

func wrapRunErr(err error) error {
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("claimtx: router: %w", err)
	}
	return nil
}

func (p *parts) close() error {
	var errs []error
	// A running consumer shuts down gracefully first.
	p.stopOnce.Do(func() { close(p.stop) })
	p.runMu.Lock()
	ran := p.ran
	p.runMu.Unlock()
	if ran {
		<-p.stopped
	}
	// A router that never ran has nothing to stop, and Watermill's Close
	// would wait out its whole CloseTimeout for handlers that never
	// started, then fail with "router close timeout".
	if p.closeMore != nil && ran {
		errs = append(errs, p.closeMore())
	}
	if p.sub != nil {
		errs = append(errs, p.sub.Close())
	}
	// The last settled positions, once the subscription is closed (no
	// ack comes after it).
	fctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	p.flushPositions(fctx)
	cancel()
	if p.pub != nil {
		errs = append(errs, p.pub.Close())
	}
	if p.ownsPool && p.pool != nil {
		p.pool.Close()
	}
	return errors.Join(errs...)
}
