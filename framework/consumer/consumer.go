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
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// Config describes one claimtx consumer. docs/configuration.md lists every
// field with its YAML key, variable and default.
type Config struct {
	// Name is stored with every claim ("loyalty"). Required.
	Name string
	// Topic is consumed (a RabbitMQ durable queue, a Kafka topic). Required.
	Topic string
	// Key is a key spec resolved with Extractors ("metadata:event_id"), the
	// alternative to Claim.Key; one is required outside ModeNaturalKey.
	Key string
	// EventTime is an event-time spec resolved with Extractors
	// ("json:occurred_at"), the alternative to Claim.EventTime.
	EventTime string
	// OrderKey is a key spec resolved with Extractors
	// ("template:{payload.account_id}"), the alternative to
	// Claim.OrderKey: ordered effects (docs/effects.md, "Ordered
	// effects"). It needs one message in flight: the broker's concurrency
	// defaults to 1 with it, and a larger one is refused.
	OrderKey string
	// ParkRetry is middleware.Park.Retry: the delay before a parked key's
	// first automatic release. Defaults to 0: released when an operator
	// asks.
	ParkRetry time.Duration
	// ParkedWarnAge makes the readiness report warn when a key has been
	// parked for longer. Defaults to 1h.
	ParkedWarnAge time.Duration

	// Pool runs the claim transactions. Defaults to one opened (and closed
	// by Close) from DatabaseURL.
	Pool *pgxpool.Pool
	// DatabaseURL is used when Pool is nil.
	DatabaseURL string
	// Store names claimtx's schema and tables. Defaults to store.Config{}.
	Store store.Config
	// Broker selects and configures the broker. Defaults to local RabbitMQ.
	Broker brokers.Config
	// Extractors resolves Key and EventTime. Defaults to the built-in ones.
	Extractors *framework.Registry

	// Claim configures the claim middleware. The consumer fills Store,
	// Consumer, Logger and OnOutcome itself and refuses them
	// (docs/configuration.md names the Config field to set instead).
	Claim middleware.Claim
	// Retention, with an event time, poisons as Expired a message older
	// than it (middleware.ExpiryGuard), whose claim cleanup may have
	// removed; it is checked against the broker's replay horizon
	// (docs/operations.md) and caps Claim.CommittedKeysTTL at half of it.
	Retention time.Duration
	// StrictRetentionHorizon makes a replay horizon beyond Retention a
	// ConfigError of New instead of a warning.
	StrictRetentionHorizon bool

	// HandlerRetries bounds the in-process retries of a failed handler
	// before the message is poisoned (docs/reliability.md). Defaults to 3.
	HandlerRetries int
	// RetryInitialInterval is HandlerRetries' first backoff. Defaults to 100ms.
	RetryInitialInterval time.Duration
	// DrainTimeout is how long messages in flight at shutdown get to commit
	// before they are cancelled and nacked; Run returns within DrainTimeout
	// + 10 s (docs/reliability.md). Defaults to 15 s.
	DrainTimeout time.Duration
	// PoisonTopic receives unprocessable messages, the reason in metadata.
	// Defaults to Topic + ".poison".
	PoisonTopic string

	// StartupTimeout bounds the wait of New for each dependency
	// (docs/operations.md) and, when set, replaces the brokers'
	// DialTimeout. Negative: one attempt. Defaults to 30 s.
	StartupTimeout time.Duration

	// HandlerTimeout bounds one attempt at a message, claim wait and commit
	// included (docs/reliability.md). Defaults to 0: none.
	HandlerTimeout time.Duration

	// OnOutcome is called with each message's final outcome when it is
	// acked or nacked.
	OnOutcome func(middleware.Result)
	// Registerer, when set, receives claimtx's and Watermill's metrics.
	Registerer prometheus.Registerer
	// Tracer starts a span per claim transaction. Defaults to
	// otel.Tracer("claimtx").
	Tracer trace.Tracer
	// Logger receives the logs. Defaults to slog.Default().
	Logger *slog.Logger

	// names maps the fields LoadConfig set, as errors name them, to what
	// the user wrote; nil for a Config built in code.
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
	case c.Claim.OrderKey != nil && c.OrderKey != "":
		return &framework.ConfigError{Field: "OrderKey", Reason: "set OrderKey (a spec) or Claim.OrderKey (a KeyFunc), not both"}
	case c.ParkRetry < 0:
		return &framework.ConfigError{Field: "ParkRetry", Reason: "must not be negative"}
	case c.ParkedWarnAge < 0:
		return &framework.ConfigError{Field: "ParkedWarnAge", Reason: "must not be negative"}
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
		return &framework.ConfigError{Field: "EventTime", Reason: "Retention needs an event time (EventTime or Claim.EventTime) to tell a message's age"}
	case c.Retention > 0 && c.Claim.CommittedKeysTTL > c.Retention/2:
		return &framework.ConfigError{Field: "Claim.CommittedKeysTTL", Reason: fmt.Sprintf("%s is more than half of Retention (%s): a cached key could outlive its claim", c.Claim.CommittedKeysTTL, c.Retention)}
	case c.RetryInitialInterval < 0:
		return &framework.ConfigError{Field: "RetryInitialInterval", Reason: "must not be negative"}
	case c.Claim.PoisonMemo && c.Claim.Mode == middleware.ModeNaturalKey:
		// NewClaim refuses it too, but only once connected.
		return &framework.ConfigError{Field: "Claim.PoisonMemo", Reason: "not supported in ModeNaturalKey (see middleware.Claim.PoisonMemo)"}
	// The consumer fills these itself.
	case c.Claim.Store != nil:
		return &framework.ConfigError{Field: "Claim.Store", Reason: "is the consumer's: set Pool or DatabaseURL, and Store"}
	case c.Claim.Consumer != "":
		return &framework.ConfigError{Field: "Claim.Consumer", Reason: "is the consumer's: set Name"}
	case c.Claim.Logger != nil:
		return &framework.ConfigError{Field: "Claim.Logger", Reason: "is the consumer's: set Logger"}
	case c.Claim.OnOutcome != nil:
		return &framework.ConfigError{Field: "Claim.OnOutcome", Reason: "is the consumer's: set OnOutcome, called once per message when it is acked or nacked (the claim's hook runs once per attempt)"}
	}
	return cmp.Or(config.ValidateConsumer("Name", c.Name), c.Store.Validate(), c.Broker.Validate())
}

// Consumer is a claimtx consumer, built by New or NewBatch.
type Consumer struct {
	*parts
	body    func(context.Context) error // consume or batchRunner.run
	running chan struct{}
	router  *message.Router // New's
	drainer *drainer        // New's
}

// parts is what New and NewBatch build alike.
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
	horizon   *horizon           // nil without Retention or a subscriber that knows its horizon
	standby   *durability        // nil unless Claim.SynchronousCommit needs a synchronous standby
	parker    *middleware.Parker // nil without an order key
	parked    *parkedWatch       // likewise
	positions bool               // the subscriber starts partitions at the stored Kafka positions
	settled   *settledPositions  // positions settled by acks, stored by watchPositions
	closeOnce sync.Once
	closeErr  error
	closeMore func() error // the router, for New

	stopCtx context.Context // cancelled by Close: Run shuts down gracefully
	stop    context.CancelFunc
	stopped chan struct{} // closed when Run has returned
	ran     bool
	runMu   sync.Mutex
}

// withDefaults returns c with the defaults documented on its fields.
func (c Config) withDefaults() Config {
	c.PoisonTopic = cmp.Or(c.PoisonTopic, c.Topic+".poison")
	c.HandlerRetries = cmp.Or(c.HandlerRetries, 3)
	c.RetryInitialInterval = cmp.Or(c.RetryInitialInterval, 100*time.Millisecond)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, defaultDrainTimeout)
	c.ParkedWarnAge = cmp.Or(c.ParkedWarnAge, defaultParkedWarnAge)
	if c.ordered() {
		// One message in flight, for the broker's order to be the order
		// the effects apply in (checkOrdered refuses more).
		c.Broker.AMQP.Concurrency = cmp.Or(c.Broker.AMQP.Concurrency, 1)
		c.Broker.NATS.Concurrency = cmp.Or(c.Broker.NATS.Concurrency, 1)
		c.Broker.NATS.MaxAckPending = cmp.Or(c.Broker.NATS.MaxAckPending, 1)
	}
	// One group per consumer: services on one topic each see all of it.
	c.Broker.Kafka.ConsumerGroup = cmp.Or(c.Broker.Kafka.ConsumerGroup, c.Name)
	if c.Broker.NATS.Durable == "" {
		// Likewise one JetStream durable, when the name is valid for one.
		named := c.Broker
		named.NATS.Durable = c.Name
		if named.Validate() == nil {
			c.Broker = named
		}
	}
	if d := c.StartupTimeout; d != 0 {
		c.Broker.AMQP.DialTimeout, c.Broker.Kafka.DialTimeout, c.Broker.NATS.DialTimeout = d, d, d
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
// the claim without EventTime (New's to add). On error it closes what it
// opened.
func open(ctx context.Context, cfg Config) (_ *parts, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg = cfg.withDefaults()
	reg := cmp.Or(cfg.Extractors, framework.NewRegistry())
	if cfg.Key != "" {
		if cfg.Claim.Key, err = reg.ParseKey(cfg.Key); err != nil {
			return nil, err
		}
	}
	if cfg.EventTime != "" {
		if cfg.Claim.EventTime, err = reg.ParseTime(cfg.EventTime); err != nil {
			return nil, err
		}
	}
	if cfg.OrderKey != "" {
		if cfg.Claim.OrderKey, err = reg.ParseKey(cfg.OrderKey); err != nil {
			return nil, config.Rename(err, func(string) (string, bool) { return "OrderKey", true })
		}
	}

	p := &parts{cfg: cfg, pool: cfg.Pool, stopped: make(chan struct{})}
	p.stopCtx, p.stop = context.WithCancel(context.Background())
	defer p.closeOnError(&err)
	if p.pool == nil {
		pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
		if err != nil {
			return nil, &framework.ConfigError{Field: "DatabaseURL", Reason: "cannot be used", Err: config.SafeError{Msg: pgxReason(err, cfg.DatabaseURL), Err: err}}
		}
		p.pool, p.ownsPool = pool, true
	}
	if p.store, err = store.New(p.pool, cfg.Store); err != nil {
		return nil, err
	}
	if err := awaitDatabase(ctx, cfg.Logger, cfg.StartupTimeout, p.pool, cfg.poolerField(), "migrate claimtx's schema", p.store.Migrate); err != nil {
		// Behind a transaction pooler it is the URL that is wrong.
		var ce *framework.ConfigError
		if errors.Is(err, store.ErrTransactionPooler) && errors.As(err, &ce) {
			return nil, cfg.named(ce)
		}
		return nil, err
	}
	if err := p.checkMemoPrivileges(ctx); err != nil {
		return nil, err
	}
	if err := p.checkParkedPrivileges(ctx); err != nil {
		return nil, err
	}
	p.checkDeadLetterPrivileges(ctx)
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
	p.report = func(r middleware.Result) {
		if p.metrics != nil {
			p.metrics.OnOutcome(r)
		}
		if cfg.OnOutcome != nil {
			cfg.OnOutcome(r)
		}
	}
	p.claim = cfg.Claim
	p.claim.Store, p.claim.Consumer, p.claim.Logger = p.store, cfg.Name, p.wlog
	p.claim.EventTime = nil // New's to set
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
	p.parked = newParkedWatch(p)
	p.health.Warnings = p.warnings
	return p, nil
}

// warnings are the readiness report's warnings.
func (p *parts) warnings() map[string]string {
	w := map[string]string{}
	if p.horizon != nil {
		maps.Copy(w, p.horizon.warnings())
	}
	if p.standby != nil {
		maps.Copy(w, p.standby.warnings())
	}
	if p.parked != nil {
		maps.Copy(w, p.parked.warnings())
	}
	return w
}

// declareQueues declares the RabbitMQ queues of both topics up front: one
// that exists with other arguments (a classic poison queue) then fails
// start-up with a ConfigError, not the first poisoning with endless
// redeliveries.
func declareQueues(cfg Config, sub message.Subscriber) error {
	si, ok := sub.(message.SubscribeInitializer)
	if !ok || cfg.Broker.Kind != "" && cfg.Broker.Kind != brokers.KindAMQP {
		return nil
	}
	for _, topic := range []string{cfg.Topic, cfg.PoisonTopic} {
		if err := si.SubscribeInitialize(topic); err != nil {
			return err
		}
	}
	return nil
}

// newPoison is the Poison middleware po (BatchOptions.Poison; zero: the
// PoisonTopic) with its empty fields filled and hooks, besides po's, that
// tell l, record the memo and log refused copies.
func (p *parts) newPoison(l *ledger, po middleware.Poison) (message.HandlerMiddleware, error) {
	onPoison, onRefused := po.OnPoison, po.OnRefused
	if po.Publisher == nil {
		po.Publisher, po.Topic, onPoison = p.pub, p.cfg.PoisonTopic, p.logPoisoned
	}
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
	return middleware.NewPoison(po)
}

// logPoisoned logs a poisoned message with its whole reason, the one log
// line that is not bounded (slogAdapter.Error): a cut one ends with the hash.
func (p *parts) logPoisoned(msg *message.Message, err error) {
	cfg := p.cfg
	reason := err.Error()
	args := []any{"consumer", cfg.Name, "topic", cfg.Topic, "poison_topic", cfg.PoisonTopic, "message_uuid", msg.UUID, "reason", reason}
	if _, cut := poison.BoundReason(reason, poison.MaxReasonBytes); cut {
		args = append(args, "reason_bytes", len(reason), "reason_sha256", poison.ReasonHash(reason))
	}
	cfg.Logger.Warn("claimtx: message poisoned", args...)
}

// logRefused logs and counts a poisoned copy the broker refused for good.
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

// poisonKey is the claim's key function under its key policy, for
// `claimtx dlq`; nil without one.
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
	if err := cfg.checkOrdered(false); err != nil {
		return nil, err
	}
	cfg = groupDefaults(cfg)
	p, err := open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer p.closeOnError(&err)
	cfg = p.cfg
	// Closed after the drain (see consume): it only waits for subscriptions.
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: routerCloseTimeout}, p.wlog)
	if err != nil {
		return nil, fmt.Errorf("claimtx: router: %w", err)
	}
	c := &Consumer{parts: p, running: router.Running(), router: router, drainer: newDrainer(cfg.Logger)}
	c.body = c.consume
	p.closeMore = router.Close
	if cfg.Registerer != nil {
		// Prefixed: Watermill's bare names collide with another router's.
		wmetrics.NewPrometheusMetricsBuilder(cfg.Registerer, "claimtx", "").AddPrometheusRouterMetrics(router)
	}
	claim := p.claim
	l := p.newLedger(cfg.Name) // the handler's name (AddConsumerHandler below)
	tracing := observe.Tracing{Tracer: cfg.Tracer}
	claim.OnOutcome = func(r middleware.Result) {
		tracing.OnOutcome(r) // the attempt's span
		l.claimed(r)
	}
	// Claims carry the event day only on a table partitioned by it.
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
	poisonMW, err := p.newPoison(l, middleware.Poison{})
	if err != nil {
		return nil, err
	}
	txh := middleware.TxHandler(handler)
	// A release runs the handler as a delivery does: within HandlerTimeout,
	// so that a handler that hangs cannot hold the releaser, and traced.
	release := handlerTimeout(cfg.HandlerTimeout)(tracing.Middleware(func(m *message.Message) ([]*message.Message, error) { return nil, txh(m) }))
	park, err := p.newParker(claim, release, l, poisonMW)
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
	// The drainer goes first: a message held back at shutdown must not reach
	// Poison, which takes the drain's cancellation for an interruption.
	router.AddMiddleware(c.drainer.middleware, l.middleware, wmw.Recoverer, poisonMW, park, retry.Middleware)
	h := router.AddConsumerHandler(cfg.Name, cfg.Topic, p.sub, middleware.TxHandler(handler))
	// Before the claim: an expired message never opens a transaction.
	if cfg.Retention > 0 {
		guard, err := middleware.NewExpiryGuard(middleware.ExpiryGuard{Retention: cfg.Retention, EventTime: cfg.Claim.EventTime})
		if err != nil {
			return nil, err
		}
		h.AddMiddleware(guard)
	}
	// HandlerTimeout sits inside Retry, so each retry gets a fresh deadline.
	h.AddMiddleware(handlerTimeout(cfg.HandlerTimeout), tracing.Middleware, claimMW)
	return c, nil
}

// groupDefaults returns cfg with what group commit needs from the broker,
// or without group commit where it cannot win. Each watermill-amqp
// subscription hands out one message at a time, so without a window no
// group would ever hold more than one: Concurrency x MaxGroup messages in
// flight keep Concurrency groups full (an AMQP_WINDOW of the user's stays).
// Kafka without KAFKA_WINDOW keeps one record in flight per partition,
// which keeps a partition's order: groups could only form across
// partitions, one transaction then serialises what the pool's connections
// would run side by side, and make bench measured it at 0.85-0.97 of one
// transaction per message (docs/benchmarks.md). There an unset MaxGroup is
// 1; a MaxGroup the user set stays.
func groupDefaults(cfg Config) Config {
	b := &cfg.Broker
	if !pg.Grouping(cfg.Claim.MaxGroup, cfg.Claim.Isolation) {
		return cfg
	}
	switch b.Kind {
	case brokers.KindKafka:
		if b.Kafka.Window <= 1 && cfg.Claim.MaxGroup == 0 {
			cfg.Claim.MaxGroup = 1
		}
	case "", brokers.KindAMQP:
		if b.AMQP.Window == 0 && !cfg.ordered() {
			conc := config.Defaults(b.AMQP).Concurrency
			b.AMQP.Window = min(conc*cmp.Or(cfg.Claim.MaxGroup, pg.DefaultMaxGroup), maxAMQPWindow)
		}
	}
	return cfg
}

// maxAMQPWindow is the largest prefetch count AMQP 0-9-1 carries.
const maxAMQPWindow = 65535

// Run consumes until ctx is cancelled or Close is called, then shuts down
// gracefully (see Config.DrainTimeout) and returns.
func (c *Consumer) Run(ctx context.Context) error { return c.run(ctx, c.body) }

// consume runs the router until ctx ends, then drains. The router's context
// is its own: the subscriptions stay open for the drained messages' acks.
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
	// Stopped while still subscribing: let the router start its handler, or
	// Watermill waits out its CloseTimeout and leaks goroutines. Bounded, as
	// Subscribe to a broker that is down waits for its dial timeout.
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
	// The subscriptions end first, so what was held back is not redelivered here.
	endSubscriptions()
	c.drainer.release()
	if err := c.router.Close(); err != nil {
		// Every message is settled or handed back: a subscriber slow to
		// close is worth a log line, not a failed shutdown.
		c.cfg.Logger.Warn("claimtx: the broker subscription did not close in time; shutting down anyway", "err", err)
		return nil
	}
	return wrapRunErr(<-done)
}

// claimFieldErr names the field of a claim's *framework.ConfigError as
// Config.Claim's.
func claimFieldErr(err error) error {
	return config.Rename(err, func(f string) (string, bool) { return "Claim." + f, true })
}

// retryable says whether a failed message is worth another attempt in
// process: not a permanent error, nor a transient one the claim retried.
func retryable(err error) bool {
	return !framework.IsPermanent(err) && !store.IsTransient(err)
}

// Running is closed once the subscription exists.
func (c *Consumer) Running() chan struct{} { return c.running }

// Health returns the readiness check, an http.Handler.
func (p *parts) Health() observe.Health { return p.health }

// Store returns the consumer's store.
func (p *parts) Store() *store.Store { return p.store }

// Pool returns the pool the claim transactions run on.
func (p *parts) Pool() *pgxpool.Pool { return p.pool }

// Publisher returns the publisher used for poisoned messages.
func (p *parts) Publisher() message.Publisher { return p.pub }

// closeOnError closes p when *err is set.
func (p *parts) closeOnError(err *error) {
	if *err != nil {
		_ = p.Close()
	}
}

// Close stops consuming and releases the broker clients and the pool it
// opened.
func (p *parts) Close() error {
	p.closeOnce.Do(func() { p.closeErr = p.close() })
	return p.closeErr
}

// run runs body once, with a context that Close ends too.
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
	defer context.AfterFunc(p.stopCtx, cancel)()
	if p.horizon != nil {
		go p.horizon.watch(ctx)
	}
	if p.standby != nil {
		go p.standby.watch(ctx)
	}
	go p.watchPositions(ctx)
	if p.parked != nil {
		go p.parked.watch(ctx)
	}
	if p.parker != nil {
		// Stopped with the consumer: a release in flight rolls back.
		done := make(chan struct{})
		go func() { defer close(done); _ = p.parker.Run(ctx) }()
		defer func() { cancel(); <-done }()
	}
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
	p.stop()
	p.runMu.Lock()
	ran := p.ran
	p.runMu.Unlock()
	if ran {
		<-p.stopped
	}
	// Closing a router that never ran waits out CloseTimeout and fails.
	if p.closeMore != nil && ran {
		errs = append(errs, p.closeMore())
	}
	if p.sub != nil {
		errs = append(errs, p.sub.Close())
	}
	// The last settled positions, once no ack can come.
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
