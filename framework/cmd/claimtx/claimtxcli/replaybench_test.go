//go:build benchreplay

// Replay throughput of `claimtx dlq replay`, on both brokers:
//
//	BENCH_REPLAY_N=100000 go test -tags benchreplay -run '^TestReplayThroughput$' -count=1 -timeout 60m -v ./framework/cmd/claimtx/claimtxcli/
//
// (`make bench-replay`). For each broker it poisons N orders (copies made
// by the Poison middleware, written in bulk), then runs the command
// in-process, output discarded: a dry run (read and classify every
// letter), then the replay (read, classify, republish with the broker's
// confirmation, remove or record progress). None is claimed, so every
// letter is replayed. It prints letters/s for each and checks the topic
// received all N.
package claimtxcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq/dlqtest"
	"github.com/claimtx/claimtx/internal/testenv"
)

func TestReplayThroughput(t *testing.T) {
	n := 100000
	if s := os.Getenv("BENCH_REPLAY_N"); s != "" {
		v, err := strconv.Atoi(s)
		require.NoError(t, err, "BENCH_REPLAY_N")
		n = v
	}
	batch := os.Getenv("BENCH_REPLAY_BATCH")
	if batch == "" {
		batch = "500"
	}
	for _, kind := range dlqtest.Brokers {
		w := dlqtest.New(t, kind, 3)
		orders := make([]*message.Message, n)
		for i := range orders {
			orders[i] = dlqtest.Order(i + 1)
		}
		start := time.Now()
		w.Publish(w.Poison, w.Poisoned("loyalty", dlqKeySpec, framework.Permanent(errors.New("bad deploy")), orders...)...)
		t.Logf("%s: %d dead letters written in %s", kind, n, time.Since(start).Round(time.Millisecond))

		flags := []string{"--broker", kind, "--topic", w.Topic, "--consumer", "loyalty", "--key-spec", dlqKeySpec,
			"--batch-size", batch, "--json", "--progress", "none"}
		if kind == "kafka" {
			flags = append(flags, "--kafka-brokers", w.KafkaAddr)
		} else {
			flags = append(flags, "--amqp-url", dlqtest.AMQPURL)
		}
		env := map[string]string{"DATABASE_URL": testenv.URL(), "CLAIMTX_SCHEMA": w.Schema}
		runCLI := func(args ...string) time.Duration {
			start := time.Now()
			code := runEnv(context.Background(), Config{}, append([]string{"dlq", "replay"}, append(args, flags...)...), io.Discard, os.Stderr, func(k string) string { return env[k] })
			require.Equal(t, exitOK, code)
			return time.Since(start)
		}
		dry := runCLI("--dry-run")
		took := runCLI()
		require.Equal(t, n, w.Depth(w.Topic), "every letter replayed")
		fmt.Printf("bench-replay %-5s N=%d batch=%s: dry run %.0f letters/s (%s), replay %.0f messages/s (%s)\n",
			kind, n, batch, float64(n)/dry.Seconds(), dry.Round(time.Millisecond), float64(n)/took.Seconds(), took.Round(time.Millisecond))
	}
}
