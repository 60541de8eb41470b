// Command demo runs the loyalty example against RabbitMQ, Kafka and NATS
// JetStream (a registered kind, brokers/nats), one transaction per message
// and in batches (BATCH_SIZE), with injected trouble — republished copies
// with new broker ids, concurrent twins, undecodable messages, a consumer
// killed with SIGKILL mid-run and restarted — waits for the broker to drain,
// and prints per broker what was expected and what the database holds. It
// exits non-zero on any mismatch.
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
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
	"github.com/claimtx/claimtx/examples/loyalty/feed"
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
		// No Kafka at KAFKA_BROKERS: host the dev broker in this process.
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

// delivery is one message as a plain (non-Watermill) producer sends it.
type delivery struct {
	eventID string
	payload []byte
}

// plan is what gets published and what the database must hold afterwards.
type plan struct {
	deliveries     []delivery
	orders         int
	bad            int
	copies, twins  int
	expectedPoints int64
}

// makePlan builds n orders, publishes ~30% of them again later as
// republished copies (a new broker message id, same event), ~10% as twins
// right behind the original (so consumers process them concurrently), and
// a handful of messages that cannot be decoded or keyed.
func makePlan(n int) plan {
	p := plan{orders: n}
	var late []delivery
	for i := 1; i <= n; i++ {
		o := feed.Order{OrderID: int64(i), CustomerID: int64(i%97 + 1), TotalCents: int64(100 + rand.IntN(100_000))}
		body, _ := json.Marshal(o)
		d := delivery{eventID: fmt.Sprintf("evt-%d", i), payload: body}
		p.expectedPoints += o.TotalCents / 100
		p.deliveries = append(p.deliveries, d)
		switch r := rand.IntN(100); {
		case r < 10:
			p.deliveries = append(p.deliveries, d)
			p.twins++
		case r < 40:
			late = append(late, d)
			p.copies++
		}
	}
	// Spread the republished copies through the second half of the stream.
	half := len(p.deliveries) / 2
	for _, d := range late {
		p.deliveries = slices.Insert(p.deliveries, half+rand.IntN(len(p.deliveries)-half+1), d)
	}
	badPayloads := []string{`{"order_id": `, `not json`, `{"customer_id": 5, "total_cents": 100}`, `{"order_id": [1], "customer_id": 1, "total_cents": 1}`, `{"order_id": 1e999999, "customer_id": 1, "total_cents": 1}`}
	for i := 0; i < 20; i++ {
		bd := delivery{eventID: fmt.Sprintf("bad-%d", i), payload: []byte(badPayloads[i%len(badPayloads)])}
		p.deliveries = slices.Insert(p.deliveries, rand.IntN(len(p.deliveries)), bd)
		p.bad++
	}
	return p
}

// brokerOps is what the demo needs of each broker, beyond the consumer.
type brokerOps interface {
	prepare(ctx context.Context) error
	publish(ctx context.Context, ds []delivery) error
	drained(ctx context.Context) (bool, error)
	poisoned(ctx context.Context) (int, error)
	close()
}

type report struct {
	broker                  string
	orders, deliveries, bad int
	applied, poisoned       int
	expectedPts, actualPts  int64
	lost, doubled           int
	kills                   int
	elapsed                 time.Duration
	err                     error
}

func (r report) ok() bool {
	return r.err == nil && r.lost == 0 && r.doubled == 0 && r.applied == r.orders &&
		r.expectedPts == r.actualPts && r.poisoned >= r.bad
}

func runBroker(ctx context.Context, o options, kind string, batch bool) (report, error) {
	id := feed.RunID()
	schema := fmt.Sprintf("demo_%s_%s", kind, id)
	topic := fmt.Sprintf("demo-orders-%s-%s", kind, id)
	label := kind
	if batch {
		label += "-batch"
	}
	rep := report{broker: label, orders: o.orders}
	fmt.Printf("== %s: topic %s, schema %s\n", label, topic, schema)
	pool, err := pgxpool.New(ctx, o.databaseURL)
	if err != nil {
		return rep, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return rep, err
	}
	if !o.keep {
		defer func() {
			if _, err := pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
				fmt.Fprintf(os.Stderr, "demo: drop schema %s: %v\n", schema, err)
			}
		}()
	}
	// search_path: the consumers' effect tables land in the run's schema.
	dbURL, err := url.Parse(o.databaseURL)
	if err != nil {
		// The error would quote the URL, password included.
		return rep, errors.New("DATABASE_URL does not parse")
	}
	q := dbURL.Query()
	q.Set("search_path", schema)
	dbURL.RawQuery = q.Encode()
	var ops brokerOps
	switch kind {
	case "amqp":
		ops = &amqpOps{url: o.amqpURL, topic: topic}
	case "kafka":
		ops = &kafkaOps{addr: o.kafkaAddr, topic: topic, group: "loyalty-" + id}
	case "nats":
		ops = &natsOps{url: o.natsURL, topic: topic, keep: o.keep}
	default:
		return rep, fmt.Errorf("unknown broker %q", kind)
	}
	defer ops.close()
	if err := ops.prepare(ctx); err != nil {
		return rep, err
	}
	env := append(os.Environ(),
		"BROKER="+kind, "DATABASE_URL="+dbURL.String(), "CLAIMTX_SCHEMA="+schema, "TOPIC="+topic,
		"AMQP_URL="+o.amqpURL, "KAFKA_BROKERS="+o.kafkaAddr, "CONCURRENCY=4", "METRICS_ADDR=127.0.0.1:0",
		"KAFKA_CONSUMER_GROUP=loyalty-"+id,
		// The SIGKILLed consumer's unacked messages come back after the
		// ack wait: 5s rather than the default 30s keeps the demo short.
		"NATS_URL="+o.natsURL, "NATS_ACK_WAIT=5s")
	if batch {
		env = append(env, "BATCH_SIZE=64", "BATCH_WORKERS=2")
	}
	var procs []*proc
	stopAll := func() {
		for _, p := range procs {
			p.stop()
		}
	}
	defer stopAll()
	startProc := func() error {
		p, err := startLoyalty(o.loyalty, env, filepath.Join(o.logDir, fmt.Sprintf("%s-%s-%d.log", kind, id, len(procs))))
		if err == nil {
			procs = append(procs, p)
		}
		return err
	}
	for range 2 {
		if err := startProc(); err != nil {
			return rep, err
		}
	}
	pl := makePlan(o.orders)
	rep.deliveries, rep.bad = len(pl.deliveries), pl.bad
	rep.expectedPts = pl.expectedPoints
	if err := ops.publish(ctx, pl.deliveries); err != nil {
		return rep, fmt.Errorf("publish: %w", err)
	}
	fmt.Printf("   published %d deliveries: %d orders, %d republished copies, %d twins, %d bad\n",
		len(pl.deliveries), pl.orders, pl.copies, pl.twins, pl.bad)
	deadline := time.Now().Add(o.timeout)
	ledger := func() (int, error) {
		var n int
		err := pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s.point_ledger", pgx.Identifier{schema}.Sanitize())).Scan(&n)
		return n, err
	}
	// Kill one consumer with SIGKILL once a third is applied, and restart it.
	if !waitUntil(deadline, 50*time.Millisecond, func() bool {
		n, err := ledger()
		return err == nil && n >= o.orders/3
	}) {
		return rep, errTimeout
	}
	procs[0].kill()
	rep.kills++
	fmt.Println("   SIGKILLed consumer 0 mid-run; restarting it")
	if err := startProc(); err != nil {
		return rep, err
	}
	// Drain: every order applied, the bad ones poisoned, the broker empty.
	if !waitUntil(deadline, 100*time.Millisecond, func() bool {
		n, err1 := ledger()
		poisoned, err2 := ops.poisoned(ctx)
		drained, err3 := ops.drained(ctx)
		return err1 == nil && err2 == nil && err3 == nil && n >= o.orders && poisoned >= pl.bad && drained
	}) {
		rep.err = errTimeout
	}
	// A graceful stop lets in-flight duplicates finish: the count is final.
	stopAll()
	tally, err := feed.Count(ctx, pool, schema)
	if err != nil {
		return rep, err
	}
	rep.applied, rep.doubled, rep.actualPts = tally.Applied, tally.Doubled, tally.Points
	rep.lost = o.orders - rep.applied
	if rep.poisoned, err = ops.poisoned(ctx); err != nil {
		return rep, err
	}
	return rep, nil
}

// waitUntil polls done every interval until true, or false past deadline.
func waitUntil(deadline time.Time, interval time.Duration, done func() bool) bool {
	for !done() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
	return true
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startLoyalty(bin string, env []string, logPath string) (*proc, error) {
	f, err := os.Create(filepath.Clean(logPath))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, err
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop asks for a graceful stop (a process already gone ignores the signal).
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.kill()
	}
}

func printTable(rs []report) {
	fmt.Println()
	fmt.Printf("%-11s %7s %10s %4s %8s %11s %8s %13s %13s %5s %7s %5s %8s  %s\n",
		"broker", "orders", "deliveries", "bad", "applied", "duplicates", "poisoned", "expected_pts", "actual_pts", "lost", "doubled", "kills", "time", "result")
	for _, r := range rs {
		res := "OK"
		if !r.ok() {
			res = "MISMATCH"
			if r.err != nil {
				res += " (" + r.err.Error() + ")"
			}
		}
		// Deliveries that were neither applied nor poisoned were absorbed
		// as duplicates; redeliveries caused by the kill come on top.
		dups := r.deliveries - r.applied - r.poisoned
		fmt.Printf("%-11s %7d %10d %4d %8d %11s %8d %13d %13d %5d %7d %5d %8s  %s\n",
			r.broker, r.orders, r.deliveries, r.bad, r.applied, fmt.Sprintf(">=%d", dups), r.poisoned,
			r.expectedPts, r.actualPts, r.lost, r.doubled, r.kills, r.elapsed.Round(100*time.Millisecond), res)
	}
	if slices.ContainsFunc(rs, func(r report) bool { return r.poisoned > r.bad }) {
		fmt.Println()
		fmt.Println("poisoned counts the copies in the poison destination, which can exceed bad: a consumer killed between")
		fmt.Println("poisoning a message and its ack poisons it again when the broker redelivers it (at-least-once poisoning);")
		fmt.Println("`claimtx dlq list` marks the repeated copies and `claimtx dlq replay` sends each message once.")
	}
}

// amqpOps publishes like a plain amqp091 producer: default exchange,
// routing key = queue name, an event_id header, no Watermill metadata.
type amqpOps struct {
	url, topic string
	conn       *amqp.Connection
}

func (a *amqpOps) prepare(ctx context.Context) error {
	conn, err := amqp.Dial(a.url)
	if err != nil {
		return fmt.Errorf("dial RabbitMQ: %w", err)
	}
	a.conn = conn
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	// Declared up front, as the consumer does, so nothing early is dropped.
	_, err = ch.QueueDeclare(a.topic, true, false, false, false, nil)
	return err
}

func (a *amqpOps) publish(ctx context.Context, ds []delivery) error {
	ch, err := a.conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, len(ds)))
	for i, d := range ds {
		err := ch.PublishWithContext(ctx, "", a.topic, false, false, amqp.Publishing{
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			MessageId:    fmt.Sprintf("broker-id-%d", i), // differs on every copy
			Headers:      amqp.Table{"event_id": d.eventID},
			Body:         d.payload,
		})
		if err != nil {
			return err
		}
	}
	for range ds {
		if c := <-confirms; !c.Ack {
			return fmt.Errorf("RabbitMQ nacked publish %d", c.DeliveryTag)
		}
	}
	return nil
}

func (a *amqpOps) queueDepth(name string) (int, error) {
	ch, err := a.conn.Channel()
	if err != nil {
		return 0, err
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		// 404: not declared yet (passive declare closed the channel).
		return 0, nil
	}
	return q.Messages, nil
}

// drained reports that no message is ready (unacked ones are invisible;
// runBroker also waits for every order and stops the consumers first).
func (a *amqpOps) drained(context.Context) (bool, error) {
	n, err := a.queueDepth(a.topic)
	return err == nil && n == 0, err
}

func (a *amqpOps) poisoned(context.Context) (int, error) {
	return a.queueDepth(a.topic + ".poison")
}

func (a *amqpOps) close() {
	if a.conn != nil {
		_ = a.conn.Close()
	}
}

// kafkaOps publishes like a plain franz-go producer (kafkaRecord).
type kafkaOps struct {
	addr, topic string
	group       string
	cl          *kgo.Client
	adm         *kadm.Client
}

const partitions = 4

func (k *kafkaOps) prepare(ctx context.Context) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.addr), kgo.ProducerLinger(0))
	if err != nil {
		return err
	}
	k.cl, k.adm = cl, kadm.NewClient(cl)
	return feed.CreateKafkaTopics(ctx, k.adm, k.topic, partitions)
}

func (k *kafkaOps) publish(ctx context.Context, ds []delivery) error {
	recs := make([]*kgo.Record, len(ds))
	for i, d := range ds {
		recs[i] = feed.KafkaRecord(k.topic, d.eventID, d.payload)
	}
	return k.cl.ProduceSync(ctx, recs...).FirstErr()
}

// drained: the group's committed offsets reached every partition's end.
func (k *kafkaOps) drained(ctx context.Context) (bool, error) {
	lags, err := k.adm.Lag(ctx, k.group)
	if err != nil {
		return false, err
	}
	l, ok := lags[k.group]
	if !ok || l.Error() != nil {
		return false, nil
	}
	total, seen := int64(0), 0
	for _, p := range l.Lag[k.topic] {
		if p.Err != nil || p.Commit.At < 0 {
			return false, nil
		}
		total += p.Lag
		seen++
	}
	return seen == partitions && total == 0, nil
}

func (k *kafkaOps) poisoned(ctx context.Context) (int, error) {
	return feed.KafkaTopicSize(ctx, k.adm, k.topic+".poison")
}

func (k *kafkaOps) close() {
	if k.cl != nil {
		k.cl.Close()
	}
}

// natsOps publishes like a plain nats.go JetStream producer: subject =
// topic, an event_id header, a fresh stream message per copy. The
// consumers run with BROKER=nats (brokers/nats, registered by loyalty).
type natsOps struct {
	url, topic string
	keep       bool // keep the streams at the end
	nc         *natsgo.Conn
	js         natsgo.JetStreamContext
}

// natsDurable is the durable (consumer name) the loyalty processes share.
const natsDurable = "loyalty"

func (n *natsOps) prepare(context.Context) error {
	nc, err := natsgo.Connect(n.url)
	if err != nil {
		return fmt.Errorf("connect to NATS at %s (start it with `nats-server -js`): %w", n.url, err)
	}
	n.nc = nc
	if n.js, err = nc.JetStream(); err != nil {
		return err
	}
	// Created up front, as the consumer would, so nothing early is dropped.
	_, err = n.js.AddStream(&natsgo.StreamConfig{Name: n.topic, Subjects: []string{n.topic}})
	if err != nil {
		return fmt.Errorf("create stream %s (is JetStream enabled? nats-server -js): %w", n.topic, err)
	}
	return nil
}

func (n *natsOps) publish(ctx context.Context, ds []delivery) error {
	for _, d := range ds {
		m := natsgo.NewMsg(n.topic)
		m.Header.Set("event_id", d.eventID)
		m.Data = d.payload
		if _, err := n.js.PublishMsg(m, natsgo.Context(ctx)); err != nil {
			return err
		}
	}
	return nil
}

// drained reports that the durable consumer acked everything the stream
// holds: its ack floor reached the stream's last message.
func (n *natsOps) drained(context.Context) (bool, error) {
	si, err := n.js.StreamInfo(n.topic)
	if err != nil {
		return false, err
	}
	ci, err := n.js.ConsumerInfo(n.topic, natsDurable)
	if errors.Is(err, natsgo.ErrConsumerNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return ci.AckFloor.Stream >= si.State.LastSeq && ci.NumPending == 0 && ci.NumAckPending == 0, nil
}

// poisoned counts the messages of the consumers' TOPIC.poison stream.
func (n *natsOps) poisoned(context.Context) (int, error) {
	si, err := n.js.StreamInfo(n.topic + "_poison")
	if errors.Is(err, natsgo.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return int(si.State.Msgs), nil
}

func (n *natsOps) close() {
	if n.nc == nil {
		return
	}
	if !n.keep {
		// Streams without limits keep everything: remove the demo's.
		_ = n.js.DeleteStream(n.topic)
		_ = n.js.DeleteStream(n.topic + "_poison")
	}
	n.nc.Close()
}
