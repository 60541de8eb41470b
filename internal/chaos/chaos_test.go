//go:build chaos

package chaos

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The harness's knobs are test flags (after -args), registered before the
// testing package parses the command line.
var (
	flagOpts              = defaults()
	flagBrokers, flagJoin string
)

func init() {
	flag.StringVar(&flagOpts.loyalty, "loyalty", flagOpts.loyalty, "path of the built examples/loyalty binary")
	flag.StringVar(&flagOpts.devkafka, "devkafka", flagOpts.devkafka, "path of the built framework/cmd/devkafka binary")
	flag.IntVar(&flagOpts.orders, "orders", flagOpts.orders, "distinct orders per broker")
	flag.IntVar(&flagOpts.bad, "bad", flagOpts.bad, "undecodable messages per broker (must be poisoned)")
	flag.IntVar(&flagOpts.consumers, "consumers", flagOpts.consumers, "loyalty processes per broker")
	flag.IntVar(&flagOpts.minKills, "kills", flagOpts.minKills, "at least this many SIGKILLs per broker")
	flag.IntVar(&flagOpts.minTerms, "terms", flagOpts.minTerms, "at least this many SIGTERM rolling restarts per broker")
	flag.IntVar(&flagOpts.minStartTerms, "start-terms", flagOpts.minStartTerms, "on -join-brokers, at least this many SIGTERMs of a consumer restarted a moment ago (as it logs, or up to 3s after it began consuming: before/while it joins the group)")
	flag.IntVar(&flagOpts.minKillTerms, "kill-terms", flagOpts.minKillTerms, "on -join-brokers, at least this many SIGTERMs of a consumer 1-2s after a SIGKILL of another (a rolling deploy meeting a crash, mid-rebalance)")
	flag.StringVar(&flagJoin, "join-brokers", strings.Join(flagOpts.joinBrokers, ","), `brokers whose runs include -start-terms and -kill-terms, comma separated ("" for none)`)
	flag.DurationVar(&flagOpts.termTimeout, "term-timeout", 0, "a consumer still running this long after SIGTERM is a hung shutdown, then SIGKILLed (default: the drain timeout, $DRAIN_TIMEOUT or 15s, plus -term-grace)")
	flag.DurationVar(&flagOpts.termGrace, "term-grace", flagOpts.termGrace, "what a SIGTERMed consumer may take beyond the drain timeout before it is a hung shutdown")
	flag.StringVar(&flagOpts.kafkaBroker, "kafka-broker", flagOpts.kafkaBroker, `Kafka broker: "devkafka" (framework/cmd/devkafka, which evicts members that died while joining) or "kfake" (a plain kfake cluster in this process, no eviction)`)
	flag.DurationVar(&flagOpts.kafkaSession, "kafka-session-timeout", 0, "KAFKA_SESSION_TIMEOUT of the Kafka consumers (default: the example's default; e.g. 3s for a quicker run)")
	flag.DurationVar(&flagOpts.kafkaRebalance, "kafka-rebalance-timeout", 0, "KAFKA_REBALANCE_TIMEOUT of the Kafka consumers (default: the example's default; e.g. 3s for a quicker run)")
	flag.DurationVar(&flagOpts.publishOver, "publish-over", 0, "spread publishing over this long (default: 2s per minimum SIGKILL or SIGTERM of the broker's run)")
	flag.StringVar(&flagBrokers, "brokers", strings.Join(flagOpts.brokers, ","), "brokers to run, comma separated: amqp, kafka, nats")
	flag.StringVar(&flagOpts.pgRestart, "pg-restart", flagOpts.pgRestart, `Postgres restart once mid-run: "private" (a cluster of the run's own, initdb and pg_ctl from the machine's packages), a command restarting the DATABASE_URL server instead (e.g. "pg_ctlcluster --skip-systemctl-redirect 15 main restart": disturbs everything else on it), or "" to skip`)
	flag.StringVar(&flagOpts.amqpDisrupt, "amqp-disrupt", flagOpts.amqpDisrupt, `RabbitMQ disruption: "own" (this run's connections, the consumers' and the runner's, by connection name) or "all" (rabbitmqctl close_all_connections: disturbs everyone on the server)`)
	flag.StringVar(&flagOpts.amqpQueueType, "amqp-queue-type", flagOpts.amqpQueueType, `RabbitMQ queue type of the run's queues, "classic" or "quorum" (default: $AMQP_QUEUE_TYPE, else classic); the consumers get it as AMQP_QUEUE_TYPE`)
	flag.DurationVar(&flagOpts.timeout, "timeout", flagOpts.timeout, "give up on a broker after this long")
	flag.StringVar(&flagOpts.logDir, "logs", flagOpts.logDir, "directory for the consumers' and the broker's logs")
	flag.BoolVar(&flagOpts.pgbouncer, "pgbouncer", false, "run the consumers through a PgBouncer of the run's own in transaction mode (.ci/pgbouncer, installed when missing) in front of the run's Postgres, DATABASE_URL with default_query_exec_mode=exec")
	flag.BoolVar(&flagOpts.keep, "keep", false, "keep the databases and queues for inspection")
	flag.Uint64Var(&flagOpts.seed, "seed", 0, "seed of the plan and the victims (0: random)")
}

// TestChaos is the chaos run make chaos, chaos-batch, chaos-quorum and
// chaos-ci start (see the package documentation). By default it restarts
// only a Postgres cluster of its own and closes only its own RabbitMQ
// connections; its load and length give it its own build tag.
func TestChaos(t *testing.T) {
	o := flagOpts
	usePrivatePostgres(t, &o)
	usePgBouncer(t, &o)
	o.brokers = strings.Split(flagBrokers, ",")
	o.joinBrokers = nil
	if flagJoin != "" {
		o.joinBrokers = strings.Split(flagJoin, ",")
	}
	// go test runs in the package directory; paths are given, as make
	// gives them, from the module root.
	for _, p := range []*string{&o.loyalty, &o.devkafka, &o.logDir} {
		if !filepath.IsAbs(*p) {
			abs, err := filepath.Abs(filepath.Join("..", "..", *p))
			if err != nil {
				t.Fatalf("chaos: %v", err)
			}
			*p = abs
		}
	}
	o.out = os.Stdout

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	reports, err := run(ctx, o)
	if err != nil {
		t.Fatalf("chaos: %v", err)
	}
	ok := true
	for _, r := range reports {
		ok = ok && r.ok()
	}
	if !ok {
		o.logf("RESULT: FAIL")
		t.FailNow()
	}
	o.logf("RESULT: OK — every order credited exactly once on every broker, through every kill and restart, nothing wrongly poisoned, no crash, no hung shutdown")
}
