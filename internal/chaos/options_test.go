package chaos

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/claimtx/claimtx/internal/testenv"
)

// privatePostgres, the default -pg-restart, runs the consumers on a
// Postgres cluster of the run's own (testenv.StartPGCluster) and restarts
// that: restarting the machine's server would break whatever else uses it.
const privatePostgres = "private"

type options struct {
	loyalty, devkafka string
	orders, bad       int
	consumers         int
	minKills          int
	minTerms          int
	// minStartTerms and minKillTerms are the SIGTERMs of joining
	// consumers, on the brokers of joinBrokers only.
	minStartTerms, minKillTerms int
	joinBrokers                 []string
	// termTimeout is when a SIGTERMed consumer counts as hung: 0 is the
	// drain timeout plus termGrace.
	termTimeout      time.Duration
	termGrace        time.Duration
	killMin, killMax time.Duration
	publishOver      time.Duration
	brokers          []string
	// pgRestart is privatePostgres, a command restarting databaseURL's
	// server, or "" for no restart.
	pgRestart string
	// pgCluster is the private cluster (usePrivatePostgres), nil if none.
	pgCluster     *testenv.PGCluster
	amqpDisrupt   string
	amqpQueueType string
	databaseURL   string
	// pgbouncer puts a PgBouncer of the run's own, in transaction mode,
	// in front of databaseURL's server (usePgBouncer), and the consumers'
	// DATABASE_URL through it; pgbouncerHost is its host:port then. The
	// runner's own checks go to Postgres directly.
	pgbouncer     bool
	pgbouncerHost string
	amqpURL       string
	natsURL       string
	// kafkaBroker is "devkafka" (the dev broker, with its evictor) or
	// "kfake" (a plain kfake cluster in this process).
	kafkaBroker string
	// kafkaSession and kafkaRebalance, when not 0, shorten the Kafka
	// consumers' timeouts; 0 leaves the example's defaults.
	kafkaSession, kafkaRebalance time.Duration
	timeout                      time.Duration
	logDir                       string
	keep                         bool
	seed                         uint64
	out                          io.Writer
}

func (o options) logf(format string, args ...any) {
	_, _ = fmt.Fprintf(o.out, format+"\n", args...)
}

// defaults are the full run's sizes; chaos-ci and the disruptive test
// shrink orders, kills and terms.
func defaults() options {
	return options{
		loyalty:   "bin/loyalty",
		devkafka:  "bin/devkafka",
		orders:    20000,
		bad:       20,
		consumers: 3,
		minKills:  15,
		minTerms:  15,
		// On Kafka, SIGTERMs of consumers still joining the group.
		minStartTerms: 10,
		minKillTerms:  10,
		joinBrokers:   []string{"kafka"},
		termGrace:     5 * time.Second,
		killMin:       time.Second,
		killMax:       3 * time.Second,
		brokers:       []string{"amqp", "kafka"},
		pgRestart:     privatePostgres,
		amqpDisrupt:   "own",
		databaseURL:   envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		amqpURL:       envOr("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		natsURL:       envOr("NATS_URL", "nats://127.0.0.1:4222"),
		kafkaBroker:   "devkafka",
		// Kafka at its default timeouts needs several minutes for the full run.
		timeout: 10 * time.Minute,
		logDir:  ".run/chaos",
		out:     os.Stdout,
	}
}

// run checks the options and runs each broker in turn; it returns an
// error only when the run could not be set up.
func run(ctx context.Context, o options) ([]report, error) {
	if o.seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		for _, c := range b {
			o.seed = o.seed<<8 | uint64(c)
		}
	}
	if o.amqpQueueType == "" {
		// The consumers' AMQP_QUEUE_TYPE passes through to them, and the
		// runner declares the queue before they start: the two must agree.
		o.amqpQueueType = envOr("AMQP_QUEUE_TYPE", "classic")
	}
	drain, err := drainTimeout()
	if err != nil {
		return nil, err
	}
	if o.termTimeout == 0 {
		o.termTimeout = drain + o.termGrace
	}
	switch {
	case o.orders <= 0 || o.bad < 0 || o.consumers <= 0 || o.minKills < 0 || o.minTerms < 0 || o.minStartTerms < 0 || o.minKillTerms < 0:
		return nil, fmt.Errorf("-orders and -consumers must be positive, -bad, -kills, -terms, -start-terms and -kill-terms not negative")
	case o.termTimeout <= 0 || o.termGrace < 0:
		return nil, fmt.Errorf("-term-timeout must be positive, -term-grace not negative")
	case o.kafkaBroker != "devkafka" && o.kafkaBroker != "kfake":
		return nil, fmt.Errorf(`-kafka-broker must be "devkafka" or "kfake", got %q`, o.kafkaBroker)
	case o.kafkaSession < 0 || o.kafkaRebalance < 0:
		return nil, fmt.Errorf("-kafka-session-timeout and -kafka-rebalance-timeout must not be negative")
	case o.amqpDisrupt != "all" && o.amqpDisrupt != "own":
		return nil, fmt.Errorf(`-amqp-disrupt must be "all" or "own", got %q`, o.amqpDisrupt)
	case o.amqpQueueType != "classic" && o.amqpQueueType != "quorum":
		return nil, fmt.Errorf(`-amqp-queue-type must be "classic" or "quorum", got %q`, o.amqpQueueType)
	case o.killMin <= 0 || o.killMax < o.killMin:
		return nil, fmt.Errorf("kill interval [%s, %s] is not valid", o.killMin, o.killMax)
	}
	for _, b := range o.joinBrokers {
		if b != "amqp" && b != "kafka" && b != "nats" {
			return nil, fmt.Errorf("-join-brokers: unknown broker %q (amqp, kafka, nats)", b)
		}
	}
	for _, b := range o.brokers {
		bin := o.loyalty
		if b == "kafka" && o.kafkaBroker == "devkafka" {
			if _, err := os.Stat(o.devkafka); err != nil {
				return nil, fmt.Errorf("devkafka binary %s: %w (run `make chaos`, which builds it)", o.devkafka, err)
			}
		} else if b != "amqp" && b != "kafka" && b != "nats" {
			return nil, fmt.Errorf("unknown broker %q (amqp, kafka, nats)", b)
		}
		if _, err := os.Stat(bin); err != nil {
			return nil, fmt.Errorf("loyalty binary %s: %w (run `make chaos`, which builds it)", bin, err)
		}
	}
	if o.pgbouncer && o.pgbouncerHost == "" {
		return nil, errors.New("-pgbouncer: the PgBouncer was not started (usePgBouncer)")
	}
	if o.pgRestart == privatePostgres && o.pgCluster == nil {
		return nil, errors.New("-pg-restart private: the private Postgres cluster was not started (usePrivatePostgres)")
	}
	if err := os.MkdirAll(o.logDir, 0o750); err != nil {
		return nil, err
	}
	o.logf("chaos: seed %d, %d orders (+%d bad) per broker, %d consumers (%s), >= %d SIGKILLs and >= %d SIGTERM rolling restarts every %s-%s, on %s also >= %d SIGTERMs while starting and >= %d 1-2s after a SIGKILL; hung shutdown: still running %s after SIGTERM (drain timeout %s + %s); Postgres restart: %q; consumers' Postgres: %s",
		o.seed, o.orders, o.bad, o.consumers, consumerMode(), o.minKills, o.minTerms, o.killMin, o.killMax,
		orNone(strings.Join(o.joinBrokers, ",")), o.minStartTerms, o.minKillTerms, o.termTimeout, drain, o.termTimeout-drain, o.pgRestart, consumerPostgres(o))
	var reports []report
	for _, b := range o.brokers {
		r := runBroker(ctx, o, b)
		o.logf("%s", r.summary())
		reports = append(reports, r)
		if ctx.Err() != nil {
			break
		}
	}
	return reports, nil
}

// drainTimeout is the consumers' drain timeout: DRAIN_TIMEOUT, which they
// inherit, or the framework's default.
func drainTimeout() (time.Duration, error) {
	v := os.Getenv("DRAIN_TIMEOUT")
	if v == "" {
		return defaultDrainTimeout, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("DRAIN_TIMEOUT %q is not a positive duration", v)
	}
	return d, nil
}

// defaultDrainTimeout is consumer.Config.DrainTimeout's default
// (framework/consumer/drain.go).
const defaultDrainTimeout = 15 * time.Second

// consumerPostgres says how the consumers reach Postgres, for the log.
func consumerPostgres(o options) string {
	if o.pgbouncerHost != "" {
		return "through PgBouncer (transaction mode) at " + o.pgbouncerHost + ", default_query_exec_mode=exec"
	}
	return "direct"
}

// consumerDatabaseURL is dbURL as the consumers get it: through the run's
// PgBouncer when there is one, with default_query_exec_mode=exec, as a pgx
// user behind a transaction pooler writes it.
func consumerDatabaseURL(o options, dbURL string) (string, error) {
	if o.pgbouncerHost == "" {
		return dbURL, nil
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", errors.New("DATABASE_URL does not parse")
	}
	u.Host = o.pgbouncerHost
	return testenv.PoolerURL(u.String()), nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// natsHostPort is the host:port of a nats:// URL, what the proxy dials.
func natsHostPort(u string) string {
	if parsed, err := url.Parse(u); err == nil && parsed.Host != "" {
		return parsed.Host
	}
	return "127.0.0.1:4222"
}

// envOr returns the environment variable name, or def when it is unset or
// empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
