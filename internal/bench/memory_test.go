//go:build bench

package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// memorySample is the consumer's memory after a forced GC, once a given
// number of messages has been applied.
type memorySample struct {
	done      int64
	heapInuse uint64
	rssKB     uint64
	goroutine int
}

// runMemory feeds n orders through a RabbitMQ queue into a claimtx
// consumer (per message through the router, or in batches) and samples the
// consumer's memory every n/10 messages. The publisher keeps the backlog
// under a bound so the broker, not this process, holds what is queued.
func runMemory(ctx context.Context, e *env, amqpURL, mode string, n, concurrency int) ([]memorySample, time.Duration, error) {
	defer deleteQueue(amqpURL, e.topic)
	conn, ch, err := confirmChannel(amqpURL, e.topic)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = conn.Close() }()

	var done atomic.Int64
	key, err := framework.ParseKeySpec(keySpec)
	if err != nil {
		return nil, 0, err
	}
	cfg := brokers.Config{}
	cfg.Kind = "amqp"
	cfg.AMQP.URL = amqpURL
	cfg.AMQP.Concurrency = concurrency
	if mode == "batch" {
		cfg.AMQP.Window = concurrency * batchWindow
	}
	onOutcome := func(r middleware.Result) {
		if r.Outcome == framework.Applied || r.Outcome == framework.Duplicate {
			done.Add(1)
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	switch mode {
	case "batch":
		c, err := consumer.NewBatch(ctx, consumer.Config{
			Name: "bench", Topic: e.topic, Key: keySpec, Pool: e.pool, Store: store.Config{Schema: e.schema},
			Broker: cfg, OnOutcome: onOutcome, Logger: slog.New(slog.DiscardHandler),
		}, effectSet, consumer.BatchOptions{MaxSize: batchWindow, Workers: concurrency})
		if err != nil {
			return nil, 0, err
		}
		defer func() { _ = c.Close() }()
		go func() { runErr <- c.Run(rctx) }()
	case "message":
		sub, err := brokers.NewSubscriber(cfg, watermill.NopLogger{})
		if err != nil {
			return nil, 0, err
		}
		defer func() { _ = sub.Close() }()
		claim := middleware.Claim{Store: e.store, Consumer: "bench", Key: key, OnOutcome: onOutcome}
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
		if err != nil {
			return nil, 0, err
		}
		h := router.AddConsumerHandler("bench", e.topic, sub, txEffect(effect))
		mw, err := middleware.NewClaim(claim)
		if err != nil {
			return nil, 0, err
		}
		h.AddMiddleware(mw)
		go func() { runErr <- router.Run(rctx) }()
	default:
		return nil, 0, fmt.Errorf("unknown memory mode %q", mode)
	}

	const backlog = 20_000
	every := int64(n / 10)
	var samples []memorySample
	start := time.Now()
	published := 0
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, backlog))
	for next := every; next <= int64(n); {
		for published < n && int64(published)-done.Load() < backlog {
			o := orderN(published)
			if err := ch.PublishWithContext(ctx, "", e.topic, false, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, Body: payload(o)}); err != nil {
				return nil, 0, err
			}
			published++
		}
		for drained := false; !drained; {
			select {
			case c := <-confirms:
				if !c.Ack {
					return nil, 0, errors.New("publish nacked")
				}
			default:
				drained = true
			}
		}
		select {
		case err := <-runErr:
			return nil, 0, fmt.Errorf("consumer stopped: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
		if d := done.Load(); d >= next {
			samples = append(samples, sample(d))
			next += every
		}
	}
	took := time.Since(start)
	cancel()
	if err := <-runErr; err != nil {
		return nil, 0, err
	}
	return samples, took, nil
}

func sample(done int64) memorySample {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := memorySample{done: done, heapInuse: ms.HeapInuse, goroutine: runtime.NumGoroutine()}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				s.rssKB, _ = strconv.ParseUint(f[1], 10, 64)
			}
		}
	}
	return s
}

func renderMemory(mode string, samples []memorySample, took time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Mode %s: %d messages in %s.\n\n| messages applied | heap in use | RSS | goroutines |\n|---:|---:|---:|---:|\n",
		mode, samples[len(samples)-1].done, took.Round(time.Second))
	for _, s := range samples {
		fmt.Fprintf(&b, "| %d | %.1f MiB | %.1f MiB | %d |\n", s.done, float64(s.heapInuse)/(1<<20), float64(s.rssKB)/1024, s.goroutine)
	}
	first, last := samples[0], samples[len(samples)-1]
	fmt.Fprintf(&b, "\nHeap in use, last sample over first: %.2fx.\n", float64(last.heapInuse)/float64(first.heapInuse))
	return b.String()
}
