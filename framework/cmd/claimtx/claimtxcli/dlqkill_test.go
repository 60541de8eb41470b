package claimtxcli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq/dlqtest"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// envDLQChild makes TestDLQChild run the claimtx command line it holds
// (JSON), as a process of its own.
const envDLQChild = "CLAIMTX_TEST_CLI_DLQ_CHILD"

// TestDLQChild is one `claimtx …` process of the dlq process tests;
// without its environment it does nothing. It runs the CLI as main does:
// the broker from the environment (brokers.LoadConfig("")), signals.
func TestDLQChild(t *testing.T) {
	spec := os.Getenv(envDLQChild)
	if spec == "" {
		t.Skip("only run as a child process of the dlq process tests")
	}
	var args []string
	require.NoError(t, json.Unmarshal([]byte(spec), &args))
	os.Args = append([]string{"claimtx"}, args...)
	Main(Config{})
}

// dlqProcess starts `claimtx args…` in w's environment.
func dlqProcess(t *testing.T, w *dlqtest.World, args ...string) (*exec.Cmd, *testenv.Output) {
	t.Helper()
	spec, err := json.Marshal(args)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^TestDLQChild$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), w.Env()...), envDLQChild+"="+string(spec), "TOPIC=", "KEY=")
	out := &testenv.Output{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	return cmd, out
}

// A replay SIGKILLed in the middle, twice, and stopped by a SIGTERM once,
// loses nothing: after each every dead letter is in the poison
// destination, back in its topic, or both. A rerun completes the replay, and a consumer run then applies
// every order exactly once (the claims turn the letters that were both
// republished and left behind, and republished twice, into duplicates).
func TestDLQReplaySurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	for _, kind := range dlqtest.Brokers {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			testDLQReplaySurvivesSIGKILL(t, kind)
		})
	}
}

func testDLQReplaySurvivesSIGKILL(t *testing.T, kind string) {
	const (
		n       = 1200
		applied = 100 // orders 1..applied were applied before (a twin got through)
	)
	ctx := context.Background()
	w := dlqtest.New(t, kind, 2)
	effects := pgx.Identifier{w.Schema, "effects"}.Sanitize()
	_, err := w.Pool.Exec(ctx, "CREATE TABLE "+effects+" (order_id bigint NOT NULL)")
	require.NoError(t, err)
	var orders []*message.Message
	all := map[string]bool{}
	for i := 1; i <= n; i++ {
		o := dlqtest.Order(i)
		orders = append(orders, o)
		all[o.UUID] = true
		if i <= applied {
			w.Claim("loyalty", fmt.Sprintf("order:%d", i), dlq.Fingerprint(o.Payload))
			_, err := w.Pool.Exec(ctx, "INSERT INTO "+effects+" VALUES ($1)", i)
			require.NoError(t, err)
		}
	}
	w.Publish(w.Poison, w.Poisoned("loyalty", dlqKeySpec, framework.Permanent(errors.New("bad deploy")), orders...)...)
	require.Equal(t, n, w.Depth(w.Poison))

	// Every dead letter is in the poison destination or in the topic.
	nothingLost := func(stage string) {
		t.Helper()
		var missing []string
		// RabbitMQ requeues a killed process's unacked messages once it
		// has seen the connection close: wait for that, not for a time.
		require.Eventually(t, func() bool {
			seen := map[string]bool{}
			for _, m := range append(w.Read(w.Poison), w.Read(w.Topic)...) {
				seen[m.UUID] = true
			}
			missing = missing[:0]
			for id := range all {
				if !seen[id] {
					missing = append(missing, id)
				}
			}
			return len(missing) == 0
		}, 20*time.Second, 50*time.Millisecond, "%s: %d dead letters are neither in %s nor in %s: %v", stage, len(missing), w.Poison, w.Topic, missing)
	}

	replay := []string{"dlq", "replay", "--topic", w.Topic, "--consumer", "loyalty", "--key-spec", dlqKeySpec, "--batch-size", "10", "--json"}
	// A SIGKILL at >= 15% of the letters to replay, a SIGTERM at >= 35%
	// (it lets the batch in flight finish, then exits 1 saying so), a
	// SIGKILL at >= 55%; --rate keeps the replay slow enough to be caught
	// in the middle.
	rounds := []struct {
		sig syscall.Signal
		at  int
	}{{syscall.SIGKILL, (n - applied) * 15 / 100}, {syscall.SIGTERM, (n - applied) * 35 / 100}, {syscall.SIGKILL, (n - applied) * 55 / 100}}
	for round, rd := range rounds {
		cmd, out := dlqProcess(t, w, append(replay, "--rate", "800")...)
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		caught := false
		require.Eventually(t, func() bool {
			select {
			case err := <-exited:
				t.Fatalf("round %d: the replay ended before it was signalled (%v):\n%s", round, err, out)
			default:
			}
			if w.Depth(w.Topic) >= rd.at {
				require.NoError(t, cmd.Process.Signal(rd.sig))
				caught = true
			}
			return caught
		}, 60*time.Second, 5*time.Millisecond, "round %d: no progress:\n%s", round, out)
		err := <-exited
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee)
		if rd.sig == syscall.SIGKILL {
			require.Equal(t, syscall.SIGKILL, ee.Sys().(syscall.WaitStatus).Signal(), "round %d", round)
		} else {
			require.Equal(t, exitFail, ee.ExitCode(), "round %d:\n%s", round, out)
			require.Contains(t, out.String(), "interrupted:", "round %d", round)
			require.Contains(t, out.String(), `"complete":false`, "round %d", round)
		}
		republished := w.Depth(w.Topic)
		require.Less(t, republished, 2*(n-applied), "round %d: stopped in the middle", round)
		t.Logf("round %d: %s with %d letters republished", round, rd.sig, republished)
		nothingLost(fmt.Sprintf("after round %d (%s)", round+1, rd.sig))
	}

	// The rerun completes.
	cmd, out := dlqProcess(t, w, replay...)
	require.NoError(t, cmd.Wait(), "%s", out)
	nothingLost("after the rerun")
	lines := bytes.Split(bytes.TrimSpace([]byte(out.String())), []byte("\n"))
	var last struct {
		Totals   dlq.Totals `json:"totals"`
		Complete bool       `json:"complete"`
	}
	require.NoError(t, json.Unmarshal(lines[len(lines)-1], &last), "%s", out)
	require.True(t, last.Complete)
	switch kind {
	case brokers.KindAMQP, brokers.KindNATS:
		// Left: exactly the already applied ones.
		left := w.Read(w.Poison)
		require.Len(t, left, applied)
		for _, m := range left {
			require.LessOrEqual(t, dlqtest.OrderID(m), applied)
		}
	case brokers.KindKafka:
		// The progress passed every letter (replayed or already applied).
		require.Equal(t, map[int32]int64{0: int64(len(w.Read(w.Poison))) - int64(partitionLen(w, 1)), 1: int64(partitionLen(w, 1))},
			w.Committed(dlq.ProgressGroup("loyalty"), w.Poison))
	}

	// The consumer, fixed, applies what came back: each order once.
	inTopic := w.Depth(w.Topic)
	require.GreaterOrEqual(t, inTopic, n-applied)
	var settled atomic.Int64
	bcfg := w.Broker
	c, err := consumer.New(ctx, consumer.Config{
		Name: "loyalty", Topic: w.Topic, Key: dlqKeySpec, Pool: w.Pool, Store: store.Config{Schema: w.Schema},
		Broker: bcfg, Logger: slog.New(slog.DiscardHandler),
		OnOutcome: func(r middleware.Result) {
			if r.Outcome == framework.Applied || r.Outcome == framework.Duplicate {
				settled.Add(1)
			}
		},
	}, func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+effects+" VALUES ($1)", dlqtest.OrderID(msg))
		return err
	})
	require.NoError(t, err)
	defer c.Close()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	require.Eventually(t, func() bool { return settled.Load() >= int64(inTopic) }, 120*time.Second, 20*time.Millisecond,
		"the consumer settled %d of %d messages", settled.Load(), inTopic)
	stop()
	require.NoError(t, <-done)

	var orderCount, doubled int
	require.NoError(t, w.Pool.QueryRow(ctx, "SELECT count(DISTINCT order_id), count(*) - count(DISTINCT order_id) FROM "+effects).Scan(&orderCount, &doubled))
	require.Equal(t, n, orderCount, "every order applied")
	require.Zero(t, doubled, "no order applied twice")
	t.Logf("%d orders applied once each from %d messages replayed into %s", n, inTopic, w.Topic)
}

// partitionLen is the number of records in partition p of w's poison topic.
func partitionLen(w *dlqtest.World, p int) int {
	k := 0
	for _, m := range w.Read(w.Poison) {
		if m.Metadata.Get("kafka_partition") == fmt.Sprint(p) {
			k++
		}
	}
	return k
}
