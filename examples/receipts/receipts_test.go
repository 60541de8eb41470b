package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/testenv"
)

// asMainEnv makes the test binary run main() instead of the tests, so the
// test starts, kills and restarts the real program (built once, with the
// race detector when the tests have it) as separate processes.
const asMainEnv = "CLAIMTX_RECEIPTS_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) != "" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// syncBuffer collects a subprocess's output while it runs.
type syncBuffer = testenv.Output

// proc is one running receipts process.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

type world struct {
	t      *testing.T
	env    []string
	pool   *pgxpool.Pool
	schema string
}

func (w world) start(extraEnv []string, args ...string) *proc {
	w.t.Helper()
	p := &proc{t: w.t, name: strings.Join(args, " "), out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], args...)
	p.cmd.Env = append(append(append(os.Environ(), asMainEnv+"=1"), w.env...), extraEnv...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	require.NoError(w.t, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	w.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if w.t.Failed() {
			w.t.Logf("--- output of %q:\n%s", p.name, p.out.String())
		}
	})
	return p
}

// run starts a process and requires it to exit 0 within a minute.
func (w world) run(extraEnv []string, args ...string) string {
	w.t.Helper()
	p := w.start(extraEnv, args...)
	p.wait(time.Minute)
	require.NoError(w.t, p.err, "%s:\n%s", p.name, p.out.String())
	return p.out.String()
}

func (p *proc) wait(d time.Duration) {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		p.t.Fatalf("%s did not exit within %s:\n%s", p.name, d, p.out.String())
	}
}

// requireKilled waits for a fault-injected process to SIGKILL itself.
func (p *proc) requireKilled() {
	p.t.Helper()
	p.wait(time.Minute)
	var exit *exec.ExitError
	require.True(p.t, errors.As(p.err, &exit), "%s exited with %v, want SIGKILL:\n%s", p.name, p.err, p.out.String())
	ws, ok := exit.Sys().(syscall.WaitStatus)
	require.True(p.t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "%s: %v:\n%s", p.name, p.err, p.out.String())
}

// stop sends SIGTERM and requires a clean exit.
func (p *proc) stop() {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(syscall.SIGTERM))
	p.wait(30 * time.Second)
	require.NoError(p.t, p.err, "%s:\n%s", p.name, p.out.String())
}

func (p *proc) count(substr string) int { return strings.Count(p.out.String(), substr) }

func (w world) scalar(sql string) int64 {
	w.t.Helper()
	var n int64
	require.NoError(w.t, w.pool.QueryRow(context.Background(), sql).Scan(&n))
	return n
}

func (w world) eventually(cond func() bool, msg string) {
	w.t.Helper()
	require.Eventually(w.t, cond, time.Minute, 20*time.Millisecond, msg)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// TestReceiptSentOnceThroughKillsAndReplays is the walkthrough of
// README.md, with RabbitMQ and with NATS JetStream (a registered kind: the
// relay publishes through brokers/nats): every OrderCompleted is published
// twice, the relay is SIGKILLed after the broker confirmed its batch and
// before marking it (so the whole batch is published again), the sender is
// SIGKILLed after the provider accepted a receipt and before its claim
// committed (so that call is made again). Each order still gets exactly
// one e-mail.
func TestReceiptSentOnceThroughKillsAndReplays(t *testing.T) {
	t.Parallel()
	t.Run("amqp", func(t *testing.T) {
		t.Parallel()
		// Queues unique to this run, deleted by RabbitMQ a minute after last use.
		receiptsWalkthrough(t, "kind: amqp\namqp:\n  nack_delay: 50ms\n  queue_arguments:\n    x-expires: 60000\n")
	})
	t.Run("nats", func(t *testing.T) {
		t.Parallel()
		nc, err := natsgo.Connect(natsURL)
		if err != nil {
			testenv.SkipOrFail(t, "NATS not reachable at %s: %v", natsURL, err)
		}
		js, err := nc.JetStream()
		require.NoError(t, err)
		run := receiptsWalkthrough(t, "kind: nats\noptions:\n  url: "+natsURL+"\n  nack_delay: 50ms\n  ack_wait: 2s\n")
		// The streams the publishers created, one per topic.
		defer nc.Close()
		for name := range js.StreamNames() {
			if strings.HasPrefix(name, "claimtx-test-receipts-") && strings.Contains(name, run) {
				_ = js.DeleteStream(name)
			}
		}
	})
}

const natsURL = "nats://127.0.0.1:4222"

// receiptsWalkthrough runs the walkthrough on the broker brokerYAML
// configures and returns the run id its topic names end with.
func receiptsWalkthrough(t *testing.T, brokerYAML string) string {
	const orders = 10
	schema := testenv.NewSchema(t)
	pool := testenv.Pool(t, schema, 2)
	dbURL, err := url.Parse(testenv.URL())
	require.NoError(t, err)
	q := dbURL.Query()
	q.Set("search_path", schema)
	dbURL.RawQuery = q.Encode()

	brokerConfig := filepath.Join(t.TempDir(), "broker.yaml")
	require.NoError(t, os.WriteFile(brokerConfig, []byte(brokerYAML), 0o600))
	run := watermill.NewShortUUID()
	provider := freeAddr(t)
	w := world{t: t, pool: pool, schema: schema, env: []string{
		"DATABASE_URL=" + dbURL.String(),
		"CLAIMTX_SCHEMA=" + schema,
		"BROKER_CONFIG=" + brokerConfig,
		"ORDERS_TOPIC=claimtx-test-receipts-orders-" + run,
		"RECEIPTS_TOPIC=claimtx-test-receipts-send-" + run,
		"PROVIDER_ADDR=" + provider,
	}}
	start := time.Now()

	prov := w.start(nil, "provider")
	w.eventually(func() bool {
		resp, err := http.Get("http://" + provider + "/healthz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusNoContent
	}, "provider up")

	// Every event twice: the orders consumer enqueues one send_receipt per
	// order, not per delivery.
	w.run(nil, "publish", "-n", fmt.Sprint(orders), "-times", "2")
	ordersProc := w.start(nil, "orders")
	w.eventually(func() bool {
		return ordersProc.count("outcome=applied") == orders && ordersProc.count("outcome=duplicate") == orders
	}, "orders consumer processed every copy")
	ordersProc.stop()
	outboxTable := pgx.Identifier{schema, "outbox"}.Sanitize()
	require.Equal(t, int64(orders), w.scalar("SELECT count(*) FROM receipt_requests"))
	require.Equal(t, int64(orders), w.scalar("SELECT count(*) FROM "+outboxTable+" WHERE sent_at IS NULL"))

	// The relay publishes the batch and dies before marking it.
	w.start([]string{"RECEIPTS_CRASH=" + crashAfterPublish}, "relay").requireKilled()
	require.Equal(t, int64(orders), w.scalar("SELECT count(*) FROM "+outboxTable+" WHERE sent_at IS NULL"), "no row was marked")

	// The sender gets the provider to send one e-mail and dies before its
	// claim commits. One delivery at a time (group commit would otherwise
	// hand out CONCURRENCY x MaxGroup on RabbitMQ), so exactly one call is
	// made.
	w.start([]string{"RECEIPTS_CRASH=" + crashAfterCall, "CONCURRENCY=1", "AMQP_WINDOW=1", "NATS_CONCURRENCY=1"}, "sender").requireKilled()
	require.Equal(t, int64(1), w.scalar("SELECT count(*) FROM provider_receipts"))
	require.Zero(t, w.scalar("SELECT count(*) FROM receipts_sent"))

	// Restarted: the relay resends the whole batch, the sender replays the
	// call it could not record, then drops every resend as a duplicate.
	relay := w.start(nil, "relay")
	sender := w.start(nil, "sender")
	w.eventually(func() bool {
		return sender.count("outcome=applied") == orders && sender.count("outcome=duplicate") == orders
	}, "sender processed the killed relay's batch and its resend")
	w.eventually(func() bool {
		return w.scalar("SELECT count(*) FROM "+outboxTable+" WHERE sent_at IS NULL") == 0
	}, "relay marked every row")
	relay.stop()
	sender.stop()
	prov.stop()

	require.Equal(t, int64(orders), w.scalar("SELECT count(*) FROM receipts_sent"))
	require.Equal(t, int64(orders), w.scalar("SELECT count(*) FROM provider_receipts"), "one e-mail per order")
	require.Equal(t, int64(orders), w.scalar("SELECT count(DISTINCT order_id) FROM provider_receipts"))
	require.Equal(t, int64(orders+1), w.scalar("SELECT sum(requests) FROM provider_receipts"), "the killed sender's call was made twice")
	require.Equal(t, int64(1), w.scalar("SELECT count(*) FROM provider_receipts WHERE requests = 2"))
	require.Equal(t, int64(orders), w.scalar(`SELECT count(*) FROM receipts_sent s JOIN provider_receipts p
		ON p.idempotency_key = s.idempotency_key AND p.receipt_id = s.provider_receipt_id AND p.order_id = s.order_id`),
		"the sender recorded the provider's one receipt for each order")
	require.Equal(t, 1, prov.count("repeated request, e-mail not sent again"))

	report := w.run(nil, "report")
	require.Contains(t, report, fmt.Sprintf("e-mails sent by the provider:        %d\n", orders))
	require.Contains(t, report, fmt.Sprintf("requests the provider received:      %d\n", orders+1))
	t.Logf("walkthrough took %s\n%s", time.Since(start).Round(time.Millisecond), report)
	return run
}
