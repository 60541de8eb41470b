// Command demo runs the loyalty example against RabbitMQ, Kafka and NATS
// JetStream (a registered kind, brokers/nats), one transaction per message
// and in batches (BATCH_SIZE), with
// injected trouble — republished copies with new broker ids, concurrent
// twins, undecodable messages, a consumer killed with SIGKILL mid-run and
// restarted — waits for the broker to drain, and prints per broker what was
// expected and what the database holds. It exits non-zero on any mismatch.
//
//	make demo            # builds examples/loyalty, then runs this
//	go run ./examples/demo -loyalty bin/loyalty -orders 3000
//
// Each run uses fresh topics/queues and its own Postgres schema (dropped at
// the end unless -keep), so runs never see each other's data.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
)

type options struct {
	loyalty     string
	orders      int
	brokers     []string
	keep        bool
	databaseURL string
	amqpURL     string
	kafkaAddr   string
	natsURL     string
	timeout     time.Duration
	logDir      string
	modes       []string
}

func main() {
	var o options
	flag.StringVar(&o.loyalty, "loyalty", "bin/loyalty", "path of the built examples/loyalty binary")
	flag.IntVar(&o.orders, "orders", 3000, "distinct orders to publish per broker")
	brokerList := flag.String("brokers", "amqp,kafka,nats", "brokers to run, comma separated")
	flag.BoolVar(&o.keep, "keep", false, "keep the demo schemas for inspection")
	flag.DurationVar(&o.timeout, "timeout", 90*time.Second, "give up on a broker after this long")
	flag.StringVar(&o.logDir, "logs", ".run/demo", "directory for the consumers' logs")
	modeList := flag.String("modes", "message,batch", "consumer modes to run per broker: message (a transaction per message) and/or batch (BATCH_SIZE=64)")
	flag.Parse()
	o.brokers = strings.Split(*brokerList, ",")
	o.modes = strings.Split(*modeList, ",")
	o.databaseURL = cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	o.amqpURL = cmp.Or(os.Getenv("AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	o.kafkaAddr = strings.Split(cmp.Or(os.Getenv("KAFKA_BROKERS"), "127.0.0.1:9092"), ",")[0]
	o.natsURL = cmp.Or(os.Getenv("NATS_URL"), "nats://127.0.0.1:4222")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ok, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(2)
	}
	if !ok {
		fmt.Println("RESULT: MISMATCH")
		os.Exit(1)
	}
	fmt.Println("RESULT: OK — every order credited exactly once on every broker")
}

func run(ctx context.Context, o options) (bool, error) {
	if _, err := os.Stat(o.loyalty); err != nil {
		return false, fmt.Errorf("loyalty binary %s: %w (run `make demo`, which builds it)", o.loyalty, err)
	}
	if err := os.MkdirAll(o.logDir, 0o750); err != nil {
		return false, err
	}
	if slices.Contains(o.brokers, "kafka") && !listening(o.kafkaAddr) {
		// No Kafka at KAFKA_BROKERS: host the dev broker in this
		// process, where the consumers (subprocesses) reach it.
		logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		br, err := kafkatest.Start(ctx, kafkatest.Options{Addr: o.kafkaAddr, Logger: logger})
		if err != nil {
			return false, fmt.Errorf("start dev Kafka broker at %s: %w", o.kafkaAddr, err)
		}
		defer func() { _ = br.Close() }()
		fmt.Printf("started the dev Kafka broker (kfake) at %s\n", o.kafkaAddr)
	}
	allOK := true
	var reports []report
	for _, b := range o.brokers {
		for _, mode := range o.modes {
			if mode != "message" && mode != "batch" {
				return false, fmt.Errorf("unknown mode %q (message or batch)", mode)
			}
			start := time.Now()
			r, err := runBroker(ctx, o, b, mode == "batch")
			if err != nil {
				return false, fmt.Errorf("%s %s: %w", b, mode, err)
			}
			r.elapsed = time.Since(start)
			reports = append(reports, r)
			allOK = allOK && r.ok()
		}
	}
	printTable(reports)
	return allOK, nil
}

func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

var errTimeout = errors.New("timed out waiting for the consumers to drain")

// withSearchPath returns dbURL with search_path set to schema, so the
// consumer's effect tables land in the run's own schema.
func withSearchPath(dbURL, schema string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		// The error would quote the URL, password included.
		return "", errors.New("DATABASE_URL does not parse")
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}
