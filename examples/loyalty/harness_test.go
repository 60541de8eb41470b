package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
	"github.com/claimtx/claimtx/examples/loyalty/feed"
	"github.com/claimtx/claimtx/internal/testenv"
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

// natsURL is the local NATS JetStream server the nats cases share; each
// harness has streams of its own (named after its topic).
const natsURL = "nats://127.0.0.1:4222"

func randID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// order is the loyalty example's message, as its producers send it.
type order = feed.Order

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
	js        natsgo.JetStreamContext
	extraEnv  []string
	// defaultKafkaTimeouts leaves the consumer's Kafka session and
	// rebalance timeouts at the example's defaults (10 s, 60 s) instead of
	// the 3 s env() sets for the fast tests.
	defaultKafkaTimeouts bool
	// cluster is the plain kfake cluster of a harness made with
	// harnessOptions.plainKafka (nil otherwise).
	cluster *kfake.Cluster
}

// harnessOptions vary newHarnessWith's world; the zero value is
// newHarness's.
type harnessOptions struct {
	// plainKafka runs Kafka on a bare kfake cluster started in the test
	// (one broker, no evictor), not on the dev broker.
	plainKafka bool
	// groupMinSessionTimeout is the plain cluster's smallest accepted
	// session timeout; defaults to 500ms.
	groupMinSessionTimeout time.Duration
	// partitions of the Kafka topic; defaults to 3.
	partitions int32
	// defaultKafkaTimeouts: see harness.defaultKafkaTimeouts.
	defaultKafkaTimeouts bool
}

func newHarness(t *testing.T, kind string) *harness {
	t.Helper()
	return newHarnessWith(t, kind, harnessOptions{})
}

func newHarnessWith(t *testing.T, kind string, opts harnessOptions) *harness {
	t.Helper()
	if opts.partitions == 0 {
		opts.partitions = 3
	}
	if opts.groupMinSessionTimeout == 0 {
		opts.groupMinSessionTimeout = 500 * time.Millisecond
	}
	pool, schema := testenv.Setup(t, 4)
	h := &harness{t: t, kind: kind, schema: schema, pool: pool, amqpURL: amqpURL,
		topic: "loyalty-test-" + randID(), group: "loyalty-test-" + randID(),
		defaultKafkaTimeouts: opts.defaultKafkaTimeouts}
	u, err := testenv.URLWithSearchPath(schema)
	require.NoError(t, err)
	h.dbURL = u
	ctx := context.Background()
	switch kind {
	case "kafka":
		if opts.plainKafka {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(opts.groupMinSessionTimeout))
			require.NoError(t, err)
			t.Cleanup(c.Close)
			h.cluster = c
			h.kafkaAddr = c.ListenAddrs()[0]
		} else {
			br, err := kafkatest.Start(ctx, kafkatest.Options{Addr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			t.Cleanup(func() { _ = br.Close() })
			h.kafkaAddr = br.Addrs()[0]
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(h.kafkaAddr), kgo.ProducerLinger(0))
		require.NoError(t, err)
		t.Cleanup(cl.Close)
		h.kcl = cl
		adm := kadm.NewClient(cl)
		require.NoError(t, feed.CreateKafkaTopics(ctx, adm, h.topic, opts.partitions))
	case "amqp":
		conn := h.amqp()
		h.deleteQueuesAtCleanup(h.topic, h.topic+".poison")
		t.Cleanup(func() { _ = h.amqpConn.Close() })
		ch, err := conn.Channel()
		require.NoError(t, err)
		_, err = ch.QueueDeclare(h.topic, true, false, false, false, nil)
		require.NoError(t, err)
		require.NoError(t, ch.Close())
	case "nats":
		nc, err := natsgo.Connect(natsURL)
		if err != nil {
			testenv.SkipOrFail(t, "NATS not reachable at %s: %v", natsURL, err)
		}
		js, err := nc.JetStream()
		require.NoError(t, err)
		h.js = js
		t.Cleanup(func() {
			defer nc.Close()
			for name := range js.StreamNames() {
				if strings.HasPrefix(name, h.topic) {
					_ = js.DeleteStream(name)
				}
			}
		})
		// The stream the adapter would create, made first so what is
		// published before a consumer starts is kept (as the AMQP queue
		// above); the poison stream is the consumer's to create.
		_, err = js.AddStream(&natsgo.StreamConfig{Name: h.topic, Subjects: []string{h.topic}})
		require.NoError(t, err)
	}
	return h
}

type proc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

// syncBuffer collects a subprocess's output while it runs.
type syncBuffer = testenv.Output

func (h *harness) env(extra ...string) []string {
	env := append(os.Environ(),
		"BROKER="+h.kind, "DATABASE_URL="+h.dbURL, "CLAIMTX_SCHEMA="+h.schema, "TOPIC="+h.topic,
		"AMQP_URL="+h.amqpURL, "KAFKA_BROKERS="+h.kafkaAddr, "KAFKA_CONSUMER_GROUP="+h.group)
	if !h.defaultKafkaTimeouts {
		env = append(env, "KAFKA_SESSION_TIMEOUT=3s", "KAFKA_REBALANCE_TIMEOUT=3s")
	}
	env = append(env, "NATS_URL="+natsURL, "NATS_ACK_WAIT=3s",
		"CONCURRENCY=4", "METRICS_ADDR=127.0.0.1:0", "HANDLER_RETRIES=1")
	env = append(env, h.extraEnv...)
	return append(env, extra...)
}

// start runs one consumer process; it is stopped (SIGTERM, then SIGKILL)
// when the test ends.
func (h *harness) start(extra ...string) *proc {
	h.t.Helper()
	return startProc(h.t, h.env(extra...))
}

// startProc runs one consumer process with env; it is stopped (SIGTERM,
// then SIGKILL) when the test ends, and its output logged if the test
// failed.
func startProc(t *testing.T, env []string) *proc {
	t.Helper()
	cmd := exec.Command(loyaltyBin)
	cmd.Env = env
	p := &proc{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	require.NoError(t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("consumer %d output:\n%s", cmd.Process.Pid, p.out.String())
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

// running reports, without waiting, whether the process is still alive.
func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
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
			recs[i] = feed.KafkaRecord(h.topic, eventIDs[i], p)
		}
		require.NoError(h.t, h.kcl.ProduceSync(ctx, recs...).FirstErr())
	case "amqp":
		h.publishAMQP(h.topic, eventIDs, payloads)
	case "nats":
		for i, p := range payloads {
			m := natsgo.NewMsg(h.topic)
			m.Header.Set("event_id", eventIDs[i])
			m.Data = p
			_, err := h.js.PublishMsg(m)
			require.NoError(h.t, err)
		}
	}
}

// publishAMQP publishes to the default exchange with routing key queue,
// with publisher confirms.
func (h *harness) publishAMQP(queue string, eventIDs []string, payloads [][]byte) {
	h.t.Helper()
	require.NoError(h.t, h.tryPublishAMQP(queue, eventIDs, payloads))
}

// tryPublishAMQP is publishAMQP returning the error, for tests that publish
// while the server drops connections (and publish again on error).
func (h *harness) tryPublishAMQP(queue string, eventIDs []string, payloads [][]byte) error {
	h.t.Helper()
	ch, err := h.amqp().Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, len(payloads)))
	for i, p := range payloads {
		if err := ch.PublishWithContext(context.Background(), "", queue, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, MessageId: randID(), Body: p,
			Headers: amqp.Table{"event_id": eventIDs[i]},
		}); err != nil {
			return err
		}
	}
	for range payloads {
		select {
		case c, ok := <-confirms:
			if !ok || !c.Ack {
				return fmt.Errorf("publish to %s: not confirmed (channel closed: %t)", queue, !ok)
			}
		case <-time.After(30 * time.Second):
			return fmt.Errorf("publish to %s: no confirm within 30s", queue)
		}
	}
	return nil
}

// amqp returns the test's own RabbitMQ connection, dialled again if the
// server closed it (the disruptive test closes it).
func (h *harness) amqp() *amqp.Connection {
	h.t.Helper()
	if h.amqpConn != nil && !h.amqpConn.IsClosed() {
		return h.amqpConn
	}
	var conn *amqp.Connection
	require.Eventually(h.t, func() bool {
		var err error
		// Named after the topic, so a test can have RabbitMQ close it
		// (testenv.CloseAMQPConnections) and no one else's.
		conn, err = amqp.DialConfig(h.amqpURL, amqp.Config{Locale: "en_US", Properties: amqp.Table{"connection_name": h.topic}})
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "dial RabbitMQ again")
	h.amqpConn = conn
	return conn
}

// deleteQueuesAtCleanup deletes queues when the test ends, on a connection
// of its own (the test's may have been closed by then).
func (h *harness) deleteQueuesAtCleanup(queues ...string) {
	h.t.Cleanup(func() {
		conn, err := amqp.Dial(h.amqpURL)
		if err != nil {
			h.t.Logf("cannot delete queues %v: %v", queues, err)
			return
		}
		defer func() { _ = conn.Close() }()
		for _, q := range queues {
			ch, err := conn.Channel()
			if err != nil {
				return
			}
			_, _ = ch.QueueDelete(q, false, false, false)
			_ = ch.Close()
		}
	})
}

// queueDepth returns the ready messages of an AMQP queue, 0 if it does not
// exist.
func (h *harness) queueDepth(queue string) int {
	h.t.Helper()
	return testenv.QueueDepth(h.t, h.amqp(), queue)
}

// queueStats asks rabbitmqctl for a queue's ready and unacknowledged
// message counts (AMQP itself only reports the ready ones).
func queueStats(t *testing.T, queue string) (ready, unacked int) {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "list_queues", "--quiet", "--no-table-headers",
		"name", "messages_ready", "messages_unacknowledged").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == queue {
			ready, err = strconv.Atoi(f[1])
			require.NoError(t, err)
			unacked, err = strconv.Atoi(f[2])
			require.NoError(t, err)
			return ready, unacked
		}
	}
	require.Failf(t, "queue not listed", "%s not in rabbitmqctl list_queues:\n%s", queue, out)
	return 0, 0
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
		ch, err := h.amqp().Channel()
		require.NoError(h.t, err)
		defer func() { _ = ch.Close() }()
		for len(out) < min && time.Now().Before(deadline) {
			d, ok, err := ch.Get(h.topic+".poison", true)
			if err != nil {
				// Not declared yet: the consumer declares it on first poison.
				ch, err = h.amqp().Channel()
				require.NoError(h.t, err)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			if !ok {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			out = append(out, amqpPoisoned(d))
		}
	case "nats":
		for len(out) < min && time.Now().Before(deadline) {
			out = h.natsPoison()
			if len(out) < min {
				time.Sleep(20 * time.Millisecond)
			}
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
				out = append(out, kafkaPoisoned(r))
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

func amqpPoisoned(d amqp.Delivery) poisonedMsg {
	m := poisonedMsg{body: d.Body, headers: map[string]string{}}
	for k, v := range d.Headers {
		m.headers[k] = fmt.Sprint(v)
	}
	return m
}

func kafkaPoisoned(r *kgo.Record) poisonedMsg {
	m := poisonedMsg{body: r.Value, headers: map[string]string{}}
	for _, hd := range r.Headers {
		m.headers[hd.Key] = string(hd.Value)
	}
	return m
}

// waitLog waits until the consumer's output contains substr.
func (p *proc) waitLog(t *testing.T, substr string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(p.out.String(), substr) },
		60*time.Second, 20*time.Millisecond, "consumer output never contained %q", substr)
}

var metricsAddrRE = regexp.MustCompile(`msg="loyalty: serving /metrics and /healthz" addr=(\S+)`)

// metricsURL is the consumer's /metrics endpoint, read from its start-up
// log (the tests bind 127.0.0.1:0).
func (p *proc) metricsURL(t *testing.T) string {
	t.Helper()
	var addr string
	require.Eventually(t, func() bool {
		m := metricsAddrRE.FindStringSubmatch(p.out.String())
		if m == nil {
			return false
		}
		addr = m[1]
		return true
	}, 60*time.Second, 20*time.Millisecond, "consumer never logged its metrics address")
	return "http://" + addr + "/metrics"
}

// outcomes scrapes claimtx_messages_total by outcome from the consumer's
// /metrics (summed over the other labels).
func (p *proc) outcomes(t *testing.T) map[string]int {
	t.Helper()
	resp, err := http.Get(p.metricsURL(t))
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	out := map[string]int{}
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "claimtx_messages_total{") {
			continue
		}
		m := outcomeRE.FindStringSubmatch(line)
		require.NotNil(t, m, "unexpected metric line %q", line)
		v, err := strconv.ParseFloat(m[2], 64)
		require.NoError(t, err)
		out[m[1]] += int(v)
	}
	return out
}

var outcomeRE = regexp.MustCompile(`outcome="([a-z_]+)".*\} (\S+)$`)

// natsPoisonStream is the stream the consumer creates for TOPIC.poison.
func (h *harness) natsPoisonStream() string { return h.topic + "_poison" }

// natsPoison returns every message of the poison stream, without
// consuming them (none yet: the stream does not exist).
func (h *harness) natsPoison() []poisonedMsg {
	h.t.Helper()
	info, err := h.js.StreamInfo(h.natsPoisonStream())
	if errors.Is(err, natsgo.ErrStreamNotFound) {
		return nil
	}
	require.NoError(h.t, err)
	var out []poisonedMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		raw, err := h.js.GetMsg(h.natsPoisonStream(), seq)
		if errors.Is(err, natsgo.ErrMsgNotFound) {
			continue
		}
		require.NoError(h.t, err)
		m := poisonedMsg{body: raw.Data, headers: map[string]string{}}
		for k := range raw.Header {
			m.headers[k] = raw.Header.Get(k)
		}
		out = append(out, m)
	}
	return out
}

// natsUnsettled is how many messages of the topic's stream the loyalty
// consumer has not acked: those past its ack floor (acked ones out of
// order above it count too, so 0 means every one is acked).
func (h *harness) natsUnsettled() int {
	h.t.Helper()
	si, err := h.js.StreamInfo(h.topic)
	require.NoError(h.t, err)
	ci, err := h.js.ConsumerInfo(h.topic, "loyalty")
	if errors.Is(err, natsgo.ErrConsumerNotFound) {
		return int(si.State.Msgs)
	}
	require.NoError(h.t, err)
	return int(si.State.LastSeq - ci.AckFloor.Stream)
}
