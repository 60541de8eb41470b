// Command devkafka is brokers/kafka/kafkatest as a process: a
// Kafka-protocol broker for development, demos and CI without a Kafka
// server (flags: devkafka -h; -addr defaults to the first address of
// KAFKA_BROKERS, -data-dir to DEVKAFKA_DATA_DIR). Once the broker accepts
// connections it prints exactly one line on standard output, which scripts
// wait for (logs go to standard error),
//
//	devkafka listening on 127.0.0.1:9092
//
// and runs until SIGINT or SIGTERM, then saves its state (with a data
// directory) and exits with status 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// defaultAddr is the first address of KAFKA_BROKERS, where the services of
// the same environment look, or Kafka's standard port (kafkatest itself
// takes a free one, as tests want).
func defaultAddr(getenv func(string) string) string {
	for _, a := range strings.Split(getenv("KAFKA_BROKERS"), ",") {
		if a = strings.TrimSpace(a); a != "" {
			return a
		}
	}
	return "127.0.0.1:9092"
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("devkafka", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", defaultAddr(getenv), "host:port to listen on and advertise (default: first of KAFKA_BROKERS)")
	dataDir := fs.String("data-dir", getenv("DEVKAFKA_DATA_DIR"), "directory to keep topics, offsets and groups in across restarts (default: DEVKAFKA_DATA_DIR; empty: memory only)")
	// kafkatest.Options' defaults, spelt out so -help shows them.
	partitions := fs.Int("partitions", 10, "partitions of auto-created topics")
	minSession := fs.Duration("min-session-timeout", 100*time.Millisecond, "smallest consumer group session timeout accepted")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "devkafka: unexpected arguments: %v\n", fs.Args())
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		_, _ = fmt.Fprintf(stderr, "devkafka: -log-level: %v\n", err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	b, err := kafkatest.Start(ctx, kafkatest.Options{
		Addr:                   *addr,
		DataDir:                *dataDir,
		Partitions:             *partitions,
		GroupMinSessionTimeout: *minSession,
		Logger:                 logger,
	})
	if err != nil {
		logger.Error("devkafka: cannot start", "err", err)
		return 1
	}
	if _, err := fmt.Fprintf(stdout, "devkafka listening on %s\n", b.Addrs()[0]); err != nil {
		// Keep serving: the broker works even if nobody reads the ready line.
		logger.Warn("devkafka: cannot print the ready line", "err", err)
	}

	<-ctx.Done()
	logger.Info("devkafka: shutting down")
	start := time.Now()
	if err := b.Close(); err != nil {
		logger.Error("devkafka: close", "err", err)
		return 1
	}
	logger.Info("devkafka: stopped", "took", time.Since(start).Round(time.Millisecond))
	return 0
}
