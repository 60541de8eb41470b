package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers/kafka/devbroker"
	"github.com/claimtx/claimtx/store/pgtest"
)

// The kill tests run the consumer the way an operator does: as its own
// process, killed with SIGKILL, checked from outside through the database.
var loyaltyBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "loyalty-test")
	if err != nil {
		panic(err)
	}
	loyaltyBin = filepath.Join(dir, "loyalty")
	build := exec.Command("go", "build", "-o", loyaltyBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build loyalty:", err)
		os.Exit(2)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

const amqpURL = "amqp://guest:guest@127.0.0.1:5672/"

func randID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

type order struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
	TotalCents int64 `json:"total_cents"`
}

// harness is one isolated world: a schema for effects and claims, a fresh
// topic/queue, and for Kafka an in-process broker of its own.
type harness struct {
	t         *testing.T
	kind      string
	schema    string
	topic     string
	group     string
	pool      *pgxpool.Pool
	dbURL     string
	kafkaAddr string
	amqpURL   string
	kcl       *kgo.Client
	amqpConn  *amqp.Connection
	extraEnv  []string
}

func newHarness(t *testing.T, kind string) *harness {
	t.Helper()
	pool, schema := pgtest.Setup(t, 4)
	h := &harness{t: t, kind: kind, schema: schema, pool: pool, amqpURL: amqpURL,
		topic: "loyalty-test-" + randID(), group: "loyalty-test-" + randID()}
	u, err := pgtest.URLWithSearchPath(schema)
	require.NoError(t, err)
	h.dbURL = u
	ctx := context.Background()
	switch kind {
	case "kafka":
		br, err := devbroker.Start(ctx, devbroker.Options{Addr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		t.Cleanup(func() { _ = br.Close() })
		h.kafkaAddr = br.Addrs()[0]
		cl, err := kgo.NewClient(kgo.SeedBrokers(h.kafkaAddr), kgo.ProducerLinger(0))
		require.NoError(t, err)
		t.Cleanup(cl.Close)
		h.kcl = cl
		adm := kadm.NewClient(cl)
		_, err = adm.CreateTopic(ctx, 3, 1, nil, h.topic)
		require.NoError(t, err)
		_, err = adm.CreateTopic(ctx, 1, 1, nil, h.topic+".poison")
		require.NoError(t, err)
	case "amqp":
		conn, err := amqp.Dial(h.amqpURL)
		require.NoError(t, err)
		h.amqpConn = conn
		t.Cleanup(func() {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(h.topic, false, false, false)
				_, _ = ch.QueueDelete(h.topic+".poison", false, false, false)
				_ = ch.Close()
			}
			_ = conn.Close()
		})
		ch, err := conn.Channel()
		require.NoError(t, err)
		_, err = ch.QueueDeclare(h.topic, true, false, false, false, nil)
		require.NoError(t, err)
		require.NoError(t, ch.Close())
	}
	return h
}

type proc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (h *harness) env(extra ...string) []string {
	env := append(os.Environ(),
		"BROKER="+h.kind, "DATABASE_URL="+h.dbURL, "CLAIMTX_SCHEMA="+h.schema, "TOPIC="+h.topic,
		"AMQP_URL="+h.amqpURL, "KAFKA_BROKERS="+h.kafkaAddr, "KAFKA_CONSUMER_GROUP="+h.group,
		"KAFKA_SESSION_TIMEOUT=3s", "KAFKA_REBALANCE_TIMEOUT=3s",
		"CONCURRENCY=4", "METRICS_ADDR=127.0.0.1:0", "HANDLER_RETRIES=1")
	env = append(env, h.extraEnv...)
	return append(env, extra...)
}

// start runs one consumer process; it is stopped (SIGTERM, then SIGKILL)
// when the test ends.
func (h *harness) start(extra ...string) *proc {
	h.t.Helper()
	cmd := exec.Command(loyaltyBin)
	cmd.Env = h.env(extra...)
	p := &proc{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	require.NoError(h.t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	h.t.Cleanup(func() {
		p.stop()
		if h.t.Failed() {
			h.t.Logf("consumer %d output:\n%s", cmd.Process.Pid, p.out.String())
		}
	})
	return p
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.kill()
	}
}

func (p *proc) exited(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// publishRaw sends payloads as a plain producer would: RabbitMQ default
// exchange with routing key = queue, Kafka with franz-go; an event_id header
// and nothing Watermill-specific.
func (h *harness) publishRaw(eventIDs []string, payloads [][]byte) {
	h.t.Helper()
	ctx := context.Background()
	switch h.kind {
	case "kafka":
		recs := make([]*kgo.Record, len(payloads))
		for i, p := range payloads {
			recs[i] = &kgo.Record{Topic: h.topic, Key: []byte(eventIDs[i]), Value: p,
				Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte(eventIDs[i])}}}
		}
		require.NoError(h.t, h.kcl.ProduceSync(ctx, recs...).FirstErr())
	case "amqp":
		ch, err := h.amqpConn.Channel()
		require.NoError(h.t, err)
		defer func() { _ = ch.Close() }()
		require.NoError(h.t, ch.Confirm(false))
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, len(payloads)))
		for i, p := range payloads {
			require.NoError(h.t, ch.PublishWithContext(ctx, "", h.topic, false, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, MessageId: randID(), Body: p,
				Headers: amqp.Table{"event_id": eventIDs[i]},
			}))
		}
		for range payloads {
			require.True(h.t, (<-confirms).Ack)
		}
	}
}

func (h *harness) publish(orders ...order) {
	h.t.Helper()
	ids := make([]string, len(orders))
	payloads := make([][]byte, len(orders))
	for i, o := range orders {
		b, err := json.Marshal(o)
		require.NoError(h.t, err)
		ids[i], payloads[i] = fmt.Sprintf("evt-%d", o.OrderID), b
	}
	h.publishRaw(ids, payloads)
}

func (h *harness) count(sql string, args ...any) int {
	h.t.Helper()
	var n int
	require.NoError(h.t, h.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// tryCount is count for polling: the consumer creates its tables on start,
// so a missing table just means "not yet".
func (h *harness) tryCount(sql string, args ...any) int {
	var n int
	if err := h.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		return -1
	}
	return n
}

func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	require.Eventually(h.t, cond, 60*time.Second, 20*time.Millisecond, what)
}

func (h *harness) waitApplied(n int) {
	h.t.Helper()
	h.waitFor(fmt.Sprintf("%d orders applied", n), func() bool {
		return h.tryCount("SELECT count(DISTINCT order_id) FROM point_ledger") >= n
	})
}

// assertExact checks each order credited exactly once and every balance
// equal to the sum of its orders' points.
func (h *harness) assertExact(orders []order) {
	h.t.Helper()
	want := map[int64]int64{}
	for _, o := range orders {
		want[o.CustomerID] += o.TotalCents / 100
	}
	require.Equal(h.t, len(orders), h.count("SELECT count(*) FROM point_ledger"), "ledger rows")
	require.Equal(h.t, len(orders), h.count("SELECT count(DISTINCT order_id) FROM point_ledger"), "distinct orders")
	rows, err := h.pool.Query(context.Background(), "SELECT customer_id, points FROM balances")
	require.NoError(h.t, err)
	got := map[int64]int64{}
	for rows.Next() {
		var c, p int64
		require.NoError(h.t, rows.Scan(&c, &p))
		got[c] = p
	}
	require.NoError(h.t, rows.Err())
	require.Equal(h.t, want, got, "balances")
}

// poisoned returns the messages in the poison destination (consuming them).
func (h *harness) poisoned(min int) []poisonedMsg {
	h.t.Helper()
	var out []poisonedMsg
	deadline := time.Now().Add(60 * time.Second)
	switch h.kind {
	case "amqp":
		ch, err := h.amqpConn.Channel()
		require.NoError(h.t, err)
		defer func() { _ = ch.Close() }()
		for len(out) < min && time.Now().Before(deadline) {
			d, ok, err := ch.Get(h.topic+".poison", true)
			if err != nil {
				// Not declared yet: the consumer declares it on first poison.
				ch, err = h.amqpConn.Channel()
				require.NoError(h.t, err)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			if !ok {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			m := poisonedMsg{body: d.Body, headers: map[string]string{}}
			for k, v := range d.Headers {
				m.headers[k] = fmt.Sprint(v)
			}
			out = append(out, m)
		}
	case "kafka":
		cl, err := kgo.NewClient(kgo.SeedBrokers(h.kafkaAddr), kgo.ConsumeTopics(h.topic+".poison"),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		require.NoError(h.t, err)
		defer cl.Close()
		for len(out) < min && time.Now().Before(deadline) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			fs := cl.PollFetches(ctx)
			cancel()
			fs.EachRecord(func(r *kgo.Record) {
				m := poisonedMsg{body: r.Value, headers: map[string]string{}}
				for _, hd := range r.Headers {
					m.headers[hd.Key] = string(hd.Value)
				}
				out = append(out, m)
			})
		}
	}
	require.GreaterOrEqual(h.t, len(out), min, "poisoned messages")
	return out
}

type poisonedMsg struct {
	body    []byte
	headers map[string]string
}

