// Command chaos runs the loyalty example under sustained trouble and checks
// that every order was still credited exactly once. For RabbitMQ, for
// Kafka (the dev broker, framework/cmd/devkafka, run as a subprocess with a
// data directory, or with -kafka-broker kfake a plain kfake cluster in this
// process) and, with -brokers ...,nats, for NATS JetStream (the local
// server, reached through a TCP proxy of the runner's) it:
//
//   - publishes -orders OrderCompleted events, ~30% of them delivered 1-3
//     extra times (half of those copies with a fresh broker message id,
//     a quarter right behind their original), plus -bad undecodable ones,
//     spread over the chaos phase;
//   - creates a fresh database per broker (dropped afterwards unless
//     -keep) and starts all -consumers loyalty processes at once on it, so
//     they race each other through the start-up DDL as replicas of a new
//     deployment do;
//   - every 1-3 s either SIGKILLs a random consumer and restarts it at
//     once (at least -kills times), or gives one a rolling restart (at
//     least -terms times): SIGTERM once it consumes, wait for it to exit
//     by itself, start a replacement;
//   - on Kafka (-join-brokers) also SIGTERMs consumers that are still
//     joining the group: a consumer restarted a moment ago (by a SIGKILL
//     or a SIGTERM) gets SIGTERM as soon as it logs or up to 3 s after it
//     began consuming (at least -start-terms times), and a SIGKILL is
//     followed 1-2 s later by a SIGTERM of another consumer, a rolling
//     deploy that meets a crash (at least -kill-terms times);
//   - counts a hung shutdown whenever a SIGTERMed consumer is still
//     running -term-timeout later (default: the consumers' drain timeout,
//     DRAIN_TIMEOUT or 15s, plus -term-grace, 5s), and SIGKILLs it;
//   - restarts Postgres once (-pg-restart) after a third of these steps;
//   - after two thirds, closes every RabbitMQ connection
//     (rabbitmqctl close_all_connections), stops and restarts the Kafka
//     broker on the same address and data directory, or cuts every
//     consumer's NATS connection at the proxy (the shared server is left
//     alone);
//   - restarts, like a supervisor, any consumer that exits by itself, and
//     counts it as a crash, as it does an exit other than 0 after SIGTERM;
//   - waits for the drain, stops the consumers gracefully and checks: one
//     ledger row per order, the sum of balances as expected, nothing lost,
//     nothing doubled, nothing left in the queue / uncommitted in the group,
//     every bad message and nothing else in the poison destination (a
//     valid order there is wrongly poisoned), no crash, no hung shutdown.
//
// The Kafka consumers run with the example's default session and
// rebalance timeouts, the ones a user runs; -kafka-session-timeout and
// -kafka-rebalance-timeout shorten them explicitly (KAFKA_SESSION_TIMEOUT
// and KAFKA_REBALANCE_TIMEOUT in the runner's environment are not passed
// on). The consumers run per message, or in batches when BATCH_SIZE (and
// BATCH_WORKERS) are set in the environment: it is passed through.
// RabbitMQ's queues are classic, or quorum queues with -amqp-queue-type
// quorum (or AMQP_QUEUE_TYPE=quorum in the environment), which the
// consumers are given as AMQP_QUEUE_TYPE.
//
// It prints one summary line per broker and exits non-zero if any check
// fails.
//
//	make chaos      # 20,000 orders, >= 15 SIGKILLs and >= 15 SIGTERMs per broker, on Kafka >= 10 and 10 SIGTERMs of joining consumers
//	make chaos-ci   # 2,000 orders, >= 3 of each
//	go run ./examples/chaos -loyalty bin/loyalty -devkafka bin/devkafka -orders 20000 -kills 15 -terms 15
//
// It restarts the shared Postgres and disconnects every RabbitMQ client on
// the host: never run it beside other tests (see DESIGN.md, "Testing on
// shared servers").
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/claimtx/claimtx/examples/internal/orderfeed"
)

// DefaultPGRestart is the command that restarts the local Postgres.
const DefaultPGRestart = "pg_ctlcluster --skip-systemctl-redirect 15 main restart"

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
	pgRestart        string
	amqpDisrupt      string
	amqpQueueType    string
	databaseURL      string
	amqpURL          string
	natsURL          string
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
		pgRestart:     DefaultPGRestart,
		amqpDisrupt:   "all",
		databaseURL:   orderfeed.EnvOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		amqpURL:       orderfeed.EnvOr("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		natsURL:       orderfeed.EnvOr("NATS_URL", "nats://127.0.0.1:4222"),
		kafkaBroker:   "devkafka",
		// Kafka at its default timeouts needs several minutes for the full run.
		timeout: 10 * time.Minute,
		logDir:  ".run/chaos",
		out:     os.Stdout,
	}
}

func main() {
	o := defaults()
	var brokerList, joinList string
	flag.StringVar(&o.loyalty, "loyalty", o.loyalty, "path of the built examples/loyalty binary")
	flag.StringVar(&o.devkafka, "devkafka", o.devkafka, "path of the built framework/cmd/devkafka binary")
	flag.IntVar(&o.orders, "orders", o.orders, "distinct orders per broker")
	flag.IntVar(&o.bad, "bad", o.bad, "undecodable messages per broker (must be poisoned)")
	flag.IntVar(&o.consumers, "consumers", o.consumers, "loyalty processes per broker")
	flag.IntVar(&o.minKills, "kills", o.minKills, "at least this many SIGKILLs per broker")
	flag.IntVar(&o.minTerms, "terms", o.minTerms, "at least this many SIGTERM rolling restarts per broker")
	flag.IntVar(&o.minStartTerms, "start-terms", o.minStartTerms, "on -join-brokers, at least this many SIGTERMs of a consumer restarted a moment ago (as it logs, or up to 3s after it began consuming: before/while it joins the group)")
	flag.IntVar(&o.minKillTerms, "kill-terms", o.minKillTerms, "on -join-brokers, at least this many SIGTERMs of a consumer 1-2s after a SIGKILL of another (a rolling deploy meeting a crash, mid-rebalance)")
	flag.StringVar(&joinList, "join-brokers", strings.Join(o.joinBrokers, ","), `brokers whose runs include -start-terms and -kill-terms, comma separated ("" for none)`)
	flag.DurationVar(&o.termTimeout, "term-timeout", 0, "a consumer still running this long after SIGTERM is a hung shutdown, then SIGKILLed (default: the drain timeout, $DRAIN_TIMEOUT or 15s, plus -term-grace)")
	flag.DurationVar(&o.termGrace, "term-grace", o.termGrace, "what a SIGTERMed consumer may take beyond the drain timeout before it is a hung shutdown")
	flag.StringVar(&o.kafkaBroker, "kafka-broker", o.kafkaBroker, `Kafka broker: "devkafka" (framework/cmd/devkafka, which evicts members that died while joining) or "kfake" (a plain kfake cluster in this process, no eviction)`)
	flag.DurationVar(&o.kafkaSession, "kafka-session-timeout", 0, "KAFKA_SESSION_TIMEOUT of the Kafka consumers (default: the example's default; e.g. 3s for a quicker run)")
	flag.DurationVar(&o.kafkaRebalance, "kafka-rebalance-timeout", 0, "KAFKA_REBALANCE_TIMEOUT of the Kafka consumers (default: the example's default; e.g. 3s for a quicker run)")
	flag.DurationVar(&o.publishOver, "publish-over", 0, "spread publishing over this long (default: 2s per minimum SIGKILL or SIGTERM of the broker's run)")
	flag.StringVar(&brokerList, "brokers", strings.Join(o.brokers, ","), "brokers to run, comma separated: amqp, kafka, nats")
	flag.StringVar(&o.pgRestart, "pg-restart", o.pgRestart, `command restarting Postgres once mid-run ("" to skip)`)
	flag.StringVar(&o.amqpDisrupt, "amqp-disrupt", o.amqpDisrupt, `RabbitMQ disruption: "all" (rabbitmqctl close_all_connections) or "own" (only this run's consumers' connections)`)
	flag.StringVar(&o.amqpQueueType, "amqp-queue-type", o.amqpQueueType, `RabbitMQ queue type of the run's queues, "classic" or "quorum" (default: $AMQP_QUEUE_TYPE, else classic); the consumers get it as AMQP_QUEUE_TYPE`)
	flag.DurationVar(&o.timeout, "timeout", o.timeout, "give up on a broker after this long")
	flag.StringVar(&o.logDir, "logs", o.logDir, "directory for the consumers' and the broker's logs")
	flag.BoolVar(&o.keep, "keep", false, "keep the databases and queues for inspection")
	flag.Uint64Var(&o.seed, "seed", 0, "seed of the plan and the victims (0: random)")
	flag.Parse()
	o.brokers = strings.Split(brokerList, ",")
	o.joinBrokers = nil
	if joinList != "" {
		o.joinBrokers = strings.Split(joinList, ",")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	reports, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	ok := true
	for _, r := range reports {
		ok = ok && r.ok()
	}
	if !ok {
		fmt.Println("RESULT: FAIL")
		os.Exit(1)
	}
	fmt.Println("RESULT: OK — every order credited exactly once on every broker, through every kill and restart, nothing wrongly poisoned, no crash, no hung shutdown")
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
		o.amqpQueueType = orderfeed.EnvOr("AMQP_QUEUE_TYPE", "classic")
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
	if err := os.MkdirAll(o.logDir, 0o750); err != nil {
		return nil, err
	}
	o.logf("chaos: seed %d, %d orders (+%d bad) per broker, %d consumers (%s), >= %d SIGKILLs and >= %d SIGTERM rolling restarts every %s-%s, on %s also >= %d SIGTERMs while starting and >= %d 1-2s after a SIGKILL; hung shutdown: still running %s after SIGTERM (drain timeout %s + %s); Postgres restart: %q",
		o.seed, o.orders, o.bad, o.consumers, consumerMode(), o.minKills, o.minTerms, o.killMin, o.killMax,
		orNone(strings.Join(o.joinBrokers, ",")), o.minStartTerms, o.minKillTerms, o.termTimeout, drain, o.termTimeout-drain, o.pgRestart)
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
