// Command loyalty is the seed's consumer: it reads OrderCompleted events
// from RabbitMQ, Kafka or NATS JetStream and credits loyalty points exactly
// once per order, however often the broker delivers them (README.md).
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/claimtx/claimtx/brokers"
	// BROKER=amqp|kafka|nats: each adapter registers its kind when linked.
	_ "github.com/claimtx/claimtx/brokers/amqp"
	_ "github.com/claimtx/claimtx/brokers/kafka"
	_ "github.com/claimtx/claimtx/brokers/nats"
	"github.com/claimtx/claimtx/examples/loyalty/feed"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/middleware"
)

const (
	defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	defaultTopic       = "order-completed"
	defaultKey         = "template:order-completed:{payload.order_id}"
	consumerName       = "loyalty"
	defaultMetricsAddr = "127.0.0.1:9464"
	// poisonSuffix is consumer.Config.PoisonTopic's default, only logged.
	poisonSuffix = ".poison"
)

// OrderCompleted is the event. Pointers tell a missing field from a zero.
type OrderCompleted struct {
	OrderID    *int64 `json:"order_id"`
	CustomerID *int64 `json:"customer_id"`
	TotalCents *int64 `json:"total_cents"`
}

// ErrBadOrder marks an event that cannot be credited, whatever the retries.
var ErrBadOrder = errors.New("loyalty: bad OrderCompleted event")

func decode(payload []byte) (orderID, customerID, totalCents int64, err error) {
	var o OrderCompleted
	if err := json.Unmarshal(payload, &o); err != nil {
		return 0, 0, 0, framework.Permanent(fmt.Errorf("%w: %w", ErrBadOrder, err))
	}
	switch {
	case o.OrderID == nil:
		return 0, 0, 0, framework.Permanent(fmt.Errorf("%w: order_id is missing", ErrBadOrder))
	case o.CustomerID == nil:
		return 0, 0, 0, framework.Permanent(fmt.Errorf("%w: customer_id is missing", ErrBadOrder))
	case o.TotalCents == nil:
		return 0, 0, 0, framework.Permanent(fmt.Errorf("%w: total_cents is missing", ErrBadOrder))
	case *o.TotalCents < 0:
		return 0, 0, 0, framework.Permanent(fmt.Errorf("%w: total_cents is negative", ErrBadOrder))
	}
	return *o.OrderID, *o.CustomerID, *o.TotalCents, nil
}

// rejects is README.md's LOYALTY_REJECT_ORDERS (fault injection): the
// order ids the handler refuses for good, as a broken handler would, so a
// test can park them (ORDER_KEY), restart without it and release them.
type rejects map[int64]bool

// parseRejects reads LOYALTY_REJECT_ORDERS, comma-separated order ids.
func parseRejects(v string) (rejects, error) {
	r := rejects{}
	for f := range strings.SplitSeq(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		id, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, &framework.ConfigError{Field: "LOYALTY_REJECT_ORDERS", Reason: "not a comma-separated list of order ids"}
		}
		r[id] = true
	}
	return r, nil
}

// check refuses a rejected order permanently.
func (r rejects) check(orderID int64) error {
	if r[orderID] {
		return framework.Permanent(fmt.Errorf("%w: order %d is rejected (LOYALTY_REJECT_ORDERS)", ErrBadOrder, orderID))
	}
	return nil
}

// decode is decode with the rejected orders refused.
func (r rejects) decode(payload []byte) (orderID, customerID, totalCents int64, err error) {
	if orderID, customerID, totalCents, err = decode(payload); err == nil {
		err = r.check(orderID)
	}
	return orderID, customerID, totalCents, err
}

// credit is the effect, run inside the claim transaction: both writes
// commit with the claim or not at all.
func (r rejects) credit(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	orderID, customerID, totalCents, err := r.decode(msg.Payload)
	if err != nil {
		return err
	}
	points := totalCents / 100
	if _, err := tx.Exec(ctx, `INSERT INTO balances (customer_id, points) VALUES ($1, $2)
		ON CONFLICT (customer_id) DO UPDATE SET points = balances.points + EXCLUDED.points`, customerID, points); err != nil {
		return fmt.Errorf("loyalty: credit balance: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO point_ledger (customer_id, order_id, points) VALUES ($1, $2, $3)`,
		customerID, orderID, points); err != nil {
		return fmt.Errorf("loyalty: ledger: %w", err)
	}
	return nil
}

// applyOrdersSQL credits a batch in one statement: the ledger rows, and the
// balance increments summed per customer and applied in customer order, so
// concurrent batches queue on a shared customer instead of deadlocking.
const applyOrdersSQL = `WITH o AS (
	SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS o(customer_id, order_id, points)
), ledger AS (
	INSERT INTO point_ledger (customer_id, order_id, points) SELECT customer_id, order_id, points FROM o
)
INSERT INTO balances (customer_id, points)
SELECT customer_id, sum(points) FROM o GROUP BY customer_id ORDER BY customer_id
ON CONFLICT (customer_id) DO UPDATE SET points = balances.points + EXCLUDED.points`

// creditSet is credit for a batch (BATCH_SIZE > 0): the newly claimed
// messages of one claim transaction at once. A bad event fails the set;
// the batch isolates it by bisection and it is poisoned alone.
func (r rejects) creditSet(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
	customers := make([]int64, len(msgs))
	orders := make([]int64, len(msgs))
	points := make([]int64, len(msgs))
	for i, msg := range msgs {
		orderID, customerID, totalCents, err := r.decode(msg.Payload)
		if err != nil {
			return err
		}
		customers[i], orders[i], points[i] = customerID, orderID, totalCents/100
	}
	if _, err := tx.Exec(ctx, applyOrdersSQL, customers, orders, points); err != nil {
		return fmt.Errorf("loyalty: credit batch: %w", err)
	}
	return nil
}

// createTables creates the effect tables, if missing, in the default schema.
// point_ledger's applied_seq is the order the credits committed in (ordered
// effects are checked by it from outside); a ledger made before it gets
// the column once, numbering its rows in their physical order.
func createTables(ctx context.Context, pool *pgxpool.Pool) error {
	return feed.CreateTablesOnce(ctx, pool, "claimtx-example-loyalty-tables",
		`SELECT to_regclass('balances') IS NOT NULL AND EXISTS (SELECT 1 FROM pg_attribute
			WHERE attrelid = to_regclass('point_ledger') AND attname = 'applied_seq' AND NOT attisdropped)`, `
CREATE TABLE IF NOT EXISTS balances (
    customer_id bigint PRIMARY KEY,
    points      bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS point_ledger (
    customer_id bigint      NOT NULL,
    order_id    bigint      NOT NULL,
    points      bigint      NOT NULL,
    created_at  timestamptz DEFAULT now(),
    applied_seq bigint      GENERATED ALWAYS AS IDENTITY
);
ALTER TABLE point_ledger ADD COLUMN IF NOT EXISTS applied_seq bigint GENERATED ALWAYS AS IDENTITY`)
}

func run(ctx context.Context, logger *slog.Logger) error {
	// The YAML file CONFIG_FILE names, if any, with the environment over
	// it (README.md); the Kafka group defaults to the consumer's Name.
	configFile := os.Getenv("CONFIG_FILE")
	cfg, err := consumer.LoadConfig(configFile)
	if err != nil {
		return err
	}
	cfg.Name, cfg.Topic, cfg.Key = cmp.Or(cfg.Name, consumerName), cmp.Or(cfg.Topic, defaultTopic), cmp.Or(cfg.Key, defaultKey)
	cfg.Broker = natsDefaults(cfg.Broker, cfg.Name)
	// A registered kind's settings (NATS_*) are checked by Validate, not
	// by the loader: before connecting anywhere.
	if err := cfg.Broker.Validate(); err != nil {
		return err
	}
	cfg.DatabaseURL = cmp.Or(cfg.DatabaseURL, defaultDatabaseURL)
	// The specs are checked before connecting, so a typo fails at once (not
	// after consumer.New created the tables), named as the operator wrote it.
	if _, err := framework.ParseKeySpec(cfg.Key); err != nil {
		return specNamed(err, configFile, "KEY", "key")
	}
	if cfg.EventTime != "" {
		if _, err := framework.ParseTimeSpec(cfg.EventTime); err != nil {
			return specNamed(err, configFile, "EVENT_TIME", "event_time")
		}
	} else if cfg.Retention > 0 {
		return specNamed(&framework.ConfigError{Reason: "retention needs an event time to tell a message's age"}, configFile, "EVENT_TIME", "event_time")
	}
	cfg.Logger = logger
	if configFile != "" {
		logger.Info("loyalty: configuration file", "path", configFile)
	}
	// Passwords are redacted (consumer.Config.String).
	logger.Debug("loyalty: configuration", "config", cfg.String())
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		// LoadConfig has parsed it; pgx's error would quote it.
		return &framework.ConfigError{Field: "DATABASE_URL", Reason: "cannot be used"}
	}
	defer pool.Close()
	cfg.Pool = pool
	// The effect tables wait for the database as the consumer would
	// (StartupTimeout); a failure names PostgreSQL, the step and the cause.
	if err := consumer.AwaitDatabase(ctx, cfg, "create the loyalty tables", func(ctx context.Context) error {
		return createTables(ctx, pool)
	}); err != nil {
		return err
	}
	// Every outcome is logged at debug level with its order id, for the tests.
	// LOYALTY_CRASH_AFTER_COMMIT (fault injection) dies by SIGKILL after this
	// order's claim transaction committed and before the router acks, the
	// window a crash-after-commit test must hit exactly.
	var crashOrder int64
	crash := os.Getenv("LOYALTY_CRASH_AFTER_COMMIT") != ""
	if crash {
		if crashOrder, err = strconv.ParseInt(os.Getenv("LOYALTY_CRASH_AFTER_COMMIT"), 10, 64); err != nil {
			return &framework.ConfigError{Field: "LOYALTY_CRASH_AFTER_COMMIT", Reason: "not an order id"}
		}
	}
	cfg.OnOutcome = func(r middleware.Result) {
		if !crash && !logger.Enabled(ctx, slog.LevelDebug) {
			return
		}
		id, _, _, err := decode(r.Message.Payload)
		if err != nil {
			id = -1
		}
		logger.Debug("loyalty: outcome", "order_id", id, "outcome", string(r.Outcome), "attempts", r.Attempts, "claim_wait", r.ClaimWait)
		if crash && err == nil && r.Outcome == framework.Applied && id == crashOrder {
			logger.Warn("loyalty: fault injection: SIGKILL after commit, before ack", "order_id", id)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never ack
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Registerer = reg
	batch, err := batchOptions()
	if err != nil {
		return err
	}
	rej, err := parseRejects(os.Getenv("LOYALTY_REJECT_ORDERS"))
	if err != nil {
		return err
	}
	var c *consumer.Consumer
	if batch.MaxSize > 0 {
		if os.Getenv("LOYALTY_HANDLER_DELAY") != "" {
			// The delay wraps the per-message handler; batches would ignore it.
			return &framework.ConfigError{Field: "LOYALTY_HANDLER_DELAY", Reason: "not supported with BATCH_SIZE"}
		}
		if c, err = newBatch(ctx, cfg, batch, rej.creditSet); err != nil {
			return err
		}
		logger.Info("loyalty: consuming in batches", "broker", cfg.Broker.Kind, "topic", cfg.Topic,
			"batch_size", batch.MaxSize, "workers", batch.Workers, "poison_topic", cfg.Topic+poisonSuffix)
	} else {
		handler, err := withHandlerDelay(logger, rej.credit)
		if err != nil {
			return err
		}
		if c, err = consumer.New(ctx, cfg, handler); err != nil {
			return err
		}
		go func() {
			select {
			case <-c.Running():
				logger.Info("loyalty: consuming", "broker", cfg.Broker.Kind, "topic", cfg.Topic, "poison_topic", cfg.Topic+poisonSuffix)
			case <-ctx.Done():
			}
		}()
	}
	defer func() { _ = c.Close() }()
	if addr := cmp.Or(os.Getenv("METRICS_ADDR"), defaultMetricsAddr); addr != "off" {
		defer serveMetrics(logger, addr, reg, c.Health())()
	}
	return c.Run(ctx)
}

// specNamed names a spec's *framework.ConfigError as the operator set it:
// the variable when it is set, else the file's key when there is a file.
func specNamed(err error, configFile, variable, path string) error {
	var ce *framework.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	name := variable
	if os.Getenv(variable) == "" && configFile != "" {
		name = path
	}
	return &framework.ConfigError{Field: name, Reason: ce.Reason, Err: ce.Err}
}

// batchOptions reads BATCH_SIZE (0, the default: one transaction per
// message) and BATCH_WORKERS (default 2).
func batchOptions() (consumer.BatchOptions, error) {
	var o consumer.BatchOptions
	for _, f := range []struct {
		name string
		dst  *int
	}{{"BATCH_SIZE", &o.MaxSize}, {"BATCH_WORKERS", &o.Workers}} {
		if v := os.Getenv(f.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return o, &framework.ConfigError{Field: f.name, Reason: "not a non-negative number"}
			}
			*f.dst = n
		}
	}
	o.Workers = cmp.Or(o.Workers, 2)
	if os.Getenv("ORDER_KEY") != "" && os.Getenv("BATCH_WORKERS") == "" {
		o.Workers = 1 // an order key's batches apply one at a time
	}
	return o, nil
}

// newBatch builds the batch consumer. The broker window, unless set,
// is workers × batch size, what the batches need to fill up.
func newBatch(ctx context.Context, cfg consumer.Config, opts consumer.BatchOptions, credit middleware.SetHandlerFunc) (*consumer.Consumer, error) {
	window := opts.Workers * opts.MaxSize
	cfg.Broker.AMQP.Window = cmp.Or(cfg.Broker.AMQP.Window, window)
	cfg.Broker.Kafka.Window = cmp.Or(cfg.Broker.Kafka.Window, window)
	if os.Getenv("NATS_CONCURRENCY") == "" && cfg.OrderKey == "" {
		// One message per NATS subscription: as many as the batches hold.
		cfg.Broker.NATS.Concurrency = window
	}
	return consumer.NewBatch(ctx, cfg, credit, opts)
}

// natsDefaults gives BROKER=nats what framework/consumer gives AMQP and
// Kafka: the consumer's name as durable, CONCURRENCY, and STARTUP_TIMEOUT as
// dial timeout, unless NATS_DURABLE, _CONCURRENCY or _DIAL_TIMEOUT are set.
func natsDefaults(b brokers.Config, name string) brokers.Config {
	if b.Kind != brokers.KindNATS {
		return b
	}
	b.NATS.Durable = cmp.Or(b.NATS.Durable, name)
	// Both were checked by the loaders (consumer.LoadConfig, brokers).
	if n, err := strconv.Atoi(os.Getenv("CONCURRENCY")); err == nil && os.Getenv("NATS_CONCURRENCY") == "" {
		b.NATS.Concurrency = n
	}
	if d, err := time.ParseDuration(os.Getenv("STARTUP_TIMEOUT")); err == nil && os.Getenv("NATS_DIAL_TIMEOUT") == "" {
		b.NATS.DialTimeout = d
	}
	return b
}

// serveMetrics serves /metrics and /healthz. A busy address (a sibling on
// the same host) is logged and skipped: metrics must not stop the credits.
func serveMetrics(logger *slog.Logger, addr string, reg *prometheus.Registry, health http.Handler) (stop func()) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		logger.Warn("loyalty: metrics endpoint disabled", "addr", addr, "err", err)
		return func() {}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.Handle("/healthz", health)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	logger.Info("loyalty: serving /metrics and /healthz", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
}

// withHandlerDelay is README.md's LOYALTY_HANDLER_DELAY(_ORDER), for the
// rebalance and overlap tests: a sleep after the writes, in the claim tx.
func withHandlerDelay(logger *slog.Logger, h middleware.TxHandlerFunc) (middleware.TxHandlerFunc, error) {
	v := os.Getenv("LOYALTY_HANDLER_DELAY")
	if v == "" {
		return h, nil
	}
	delay, err := time.ParseDuration(v)
	if err != nil || delay < 0 {
		return nil, &framework.ConfigError{Field: "LOYALTY_HANDLER_DELAY", Reason: "not a non-negative duration"}
	}
	only, all := int64(0), true
	if v := os.Getenv("LOYALTY_HANDLER_DELAY_ORDER"); v != "" {
		if only, err = strconv.ParseInt(v, 10, 64); err != nil {
			return nil, &framework.ConfigError{Field: "LOYALTY_HANDLER_DELAY_ORDER", Reason: "not an order id"}
		}
		all = false
	}
	return func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		if err := h(ctx, tx, msg); err != nil {
			return err
		}
		id, _, _, err := decode(msg.Payload)
		if err != nil || (!all && id != only) {
			return err
		}
		logger.Warn("loyalty: fault injection: holding the claim transaction open", "order_id", id, "delay", delay)
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
			logger.Warn("loyalty: fault injection: committing the held claim transaction", "order_id", id)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, nil
}

func main() {
	// LOG_LEVEL: debug, info (the default), warn or error.
	var level slog.Level
	badLevel := os.Getenv("LOG_LEVEL") != "" && level.UnmarshalText([]byte(os.Getenv("LOG_LEVEL"))) != nil
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if badLevel {
		logger.Error("loyalty: stopped", "err", &framework.ConfigError{Field: "LOG_LEVEL", Reason: "not a level (debug, info, warn, error)"})
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, logger); err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			// A SIGTERM during start-up (a deploy that moved on): a
			// stop that was asked for, not a failure.
			logger.Info("loyalty: stopped during start-up", "err", err)
			return
		}
		logger.Error("loyalty: stopped", "err", err)
		os.Exit(1)
	}
}
