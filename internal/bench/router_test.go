//go:build bench

package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

type routerRun struct {
	broker      string
	n           int
	concurrency int
	claim       bool
	// natural: the claim in ModeNaturalKey, the ledger's unique order_id
	// the claim (with claim).
	natural   bool
	amqpURL   string
	kafkaAddr string
	workers   int
	// bare: the handler only acks, no database (the broker's own
	// consume+ack rate through the router). window: the subscriber's
	// window (AMQP_WINDOW / KAFKA_WINDOW), 0 for the per-message default.
	// preclaimed: every message's claim exists before the run, so claimtx
	// sees a duplicate storm (a replay, a group reset).
	bare       bool
	window     int
	preclaimed bool
	// warm: the same consumer (one claim middleware, so one
	// committed-key cache) applies the n messages first from one
	// topic/queue, unmeasured, and then, once all n are applied, meets
	// copies of them on a second (a producer's re-send, a redelivery after
	// a rebalance): a duplicate storm with the cache warm, measured alone.
	// Both are published before the consumer starts, so no publishing
	// shares the machine with the measured pass. In batch mode (one
	// consumer, one topic) the copies follow the originals on the same
	// topic and the rate is measured from the moment n messages had
	// settled.
	warm bool
	// group: the claim commits in groups (middleware.Claim.MaxGroup's
	// default) over a window of groupWindow messages per unit of
	// concurrency; otherwise one transaction per message (MaxGroup 1).
	group bool
	// customers spreads the orders over this many balance rows; 0: the
	// default (customers), hotCustomers for the hot-key scenario.
	customers int
	// ordered: the claim with an order key (middleware.Claim.OrderKey, the
	// customer), nothing parked, at the broker settings of the run
	// otherwise: what the parked-key lookup costs.
	ordered bool
}

// orderKeySpec is the ordered mode's order key: one per customer.
const orderKeySpec = "template:customer-{payload.customer_id}"

// phases counts a run's settled messages and signals the end of its
// passes (two in a warm batch run: only the second is measured).
type phases struct {
	n, passes  int
	done       atomic.Int64
	firstStart atomic.Int64 // start of the first pass
	boundary   atomic.Int64 // when the first pass settled its n-th message
	finished   chan struct{}
}

func newPhases(n, passes int) *phases {
	return &phases{n: n, passes: passes, finished: make(chan struct{})}
}

// passes is how many times a run's consumer meets its n messages: twice
// when warm, the first pass unmeasured.
func (r routerRun) passes() int {
	if r.warm {
		return 2
	}
	return 1
}

// brokerConfig is the subscriber configuration of a run consuming topic.
// AMQP.Concurrency is not used once the window is set (batch mode).
func (r routerRun) brokerConfig(topic string) brokers.Config {
	cfg := brokers.Config{Kind: r.broker}
	cfg.AMQP.URL = r.amqpURL
	cfg.AMQP.Concurrency = r.concurrency
	cfg.AMQP.Window = r.window
	cfg.Kafka.Brokers = []string{r.kafkaAddr}
	cfg.Kafka.ConsumerGroup = "bench-" + topic
	cfg.Kafka.Window = r.window
	if r.group {
		cfg.AMQP.Window = r.concurrency * *flagGroupWindow
		cfg.Kafka.Window = *flagKafkaGroupWindow
	}
	return cfg
}

// keySpec is the bench consumer's key spec; preclaim and rawClaimEffect
// write the keys it derives.
const keySpec = "template:order-completed:{payload.order_id}"

// txEffect is the claimed handler of every claimtx mode: decode, then
// apply in the claim's transaction.
func txEffect(apply func(context.Context, pgx.Tx, order) error) message.NoPublishHandlerFunc {
	return middleware.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		o, err := decode(msg)
		if err != nil {
			return framework.Permanent(err)
		}
		return apply(ctx, tx, o)
	})
}

// runUntil runs a consumer (run) until ph has seen every pass and returns
// when the last message settled; name labels the consumer's own error.
func runUntil(ctx context.Context, ph *phases, name string, run func(context.Context) error) (time.Time, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- run(rctx) }()
	if err := ph.await(runErr); err != nil {
		return time.Time{}, err
	}
	end := time.Now()
	cancel()
	if err := <-runErr; err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", name, err)
	}
	return end, nil
}

// settled counts one message and returns its number in the measured
// pass (from 1; 0 or less while an unmeasured first pass runs), for the
// latencies.
func (p *phases) settled() (i int64) {
	i = p.done.Add(1)
	if int(i) == p.n {
		p.boundary.Store(time.Now().UnixNano())
	}
	if int(i) == p.n*p.passes {
		close(p.finished)
	}
	return i - int64(p.n*(p.passes-1))
}

// start is when the measured pass started.
func (p *phases) start() time.Time {
	if p.passes > 1 {
		return time.Unix(0, p.boundary.Load())
	}
	return time.Unix(0, p.firstStart.Load())
}

// await waits for every pass; stopped reports a consumer that ended early.
func (p *phases) await(stopped <-chan error) error {
	select {
	case <-p.finished:
		return nil
	case err := <-stopped:
		return fmt.Errorf("consumer stopped: %w", err)
	case <-time.After(5 * time.Minute):
		return errors.New("timed out")
	}
}

func runRouter(ctx context.Context, e *env, r routerRun) (result, error) {
	topics := []string{e.topic}
	if r.warm {
		topics = append(topics, e.topic+"-copies")
	}
	for _, t := range topics {
		if err := publish(ctx, r, t, r.n); err != nil {
			return result{}, fmt.Errorf("publish: %w", err)
		}
		if r.broker == "amqp" {
			defer deleteQueue(r.amqpURL, t)
		}
	}
	if r.preclaimed {
		if err := preclaim(ctx, e, r.n); err != nil {
			return result{}, err
		}
	}
	if r.natural {
		if _, err := e.pool.Exec(ctx, `CREATE UNIQUE INDEX ON point_ledger (order_id)`); err != nil {
			return result{}, err
		}
	}
	var handler message.NoPublishHandlerFunc
	if r.bare {
		handler = func(*message.Message) error { return nil }
	} else if r.claim {
		apply := effect
		if r.natural {
			apply = effectGuarded
		}
		handler = txEffect(apply)
	} else {
		handler = func(msg *message.Message) error {
			o, err := decode(msg)
			if err != nil {
				return err
			}
			return pgx.BeginFunc(msg.Context(), e.pool, func(tx pgx.Tx) error { return effect(msg.Context(), tx, o) })
		}
	}
	var mw message.HandlerMiddleware
	if r.claim {
		key, err := framework.ParseKeySpec(keySpec)
		if err != nil {
			return result{}, err
		}
		claim := middleware.Claim{Store: e.store, Consumer: "bench", Key: key, NoPositions: *noPositions, MaxGroup: 1}
		if r.group {
			claim.MaxGroup = *flagMaxGroup
		}
		if r.natural {
			claim.Mode = middleware.ModeNaturalKey
		}
		if r.ordered {
			if claim.OrderKey, err = framework.ParseKeySpec(orderKeySpec); err != nil {
				return result{}, err
			}
		}
		if mw, err = middleware.NewClaim(claim); err != nil {
			return result{}, err
		}
	}
	var res result
	for _, t := range topics {
		var err error
		if res, err = consumePass(ctx, r, t, handler, mw); err != nil {
			return result{}, err
		}
	}
	if r.group || r.ordered {
		if err := exactlyOnce(ctx, e.pool, r.n); err != nil {
			return result{}, err
		}
	}
	if r.ordered {
		// Nothing failed, so nothing was parked: the run measured the
		// lookup finding no parked key, as the target asks.
		var parked int64
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages_parked_keys`).Scan(&parked); err != nil {
			return result{}, err
		}
		if parked != 0 {
			return result{}, fmt.Errorf("ordered: %d order keys parked, want none", parked)
		}
	}
	if r.natural {
		var rows, orders int64
		if err := e.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT order_id) FROM point_ledger`).Scan(&rows, &orders); err != nil {
			return result{}, err
		}
		if rows != int64(r.n) || orders != int64(r.n) {
			return result{}, fmt.Errorf("natural key: want %d ledger rows for as many orders, got %d rows for %d orders", r.n, rows, orders)
		}
	}
	return res, nil // the last pass's
}

// consumePass consumes the n messages of topic with a fresh subscriber and
// router, through mw when not nil, and times them.
func consumePass(ctx context.Context, r routerRun, topic string, handler message.NoPublishHandlerFunc, mw message.HandlerMiddleware) (result, error) {
	logger := watermill.NopLogger{}
	sub, err := brokers.NewSubscriber(r.brokerConfig(topic), logger)
	if err != nil {
		return result{}, err
	}
	defer func() { _ = sub.Close() }()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return result{}, err
	}

	lat := make([]time.Duration, r.n)
	ph := newPhases(r.n, 1)
	var failed atomic.Value
	measure := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			t0 := time.Now()
			ph.firstStart.CompareAndSwap(0, t0.UnixNano())
			out, err := h(msg)
			if err != nil {
				failed.Store(err)
				return out, err
			}
			if i := ph.settled(); i > 0 && int(i) <= r.n {
				lat[i-1] = time.Since(t0)
			}
			return out, nil
		}
	}
	router.AddMiddleware(measure)
	h := router.AddConsumerHandler("bench", topic, sub, handler)
	if mw != nil {
		h.AddMiddleware(mw)
	}
	end, err := runUntil(ctx, ph, "router", router.Run)
	if err != nil {
		return result{}, err
	}
	if err, ok := failed.Load().(error); ok {
		return result{}, err
	}
	return result{n: r.n, elapsed: end.Sub(ph.start()), lat: lat}, nil
}

// prepublish publishes what a run consumes from e.topic: the n messages,
// followed by copies of them when the run is warm.
func prepublish(ctx context.Context, e *env, r routerRun) error {
	return publish(ctx, r, e.topic, r.n*r.passes())
}

// publish writes total messages to topic (a queue on RabbitMQ): orders
// 0..n-1, then again from 0 when total > n.
func publish(ctx context.Context, r routerRun, topic string, total int) error {
	switch r.broker {
	case "amqp":
		conn, ch, err := confirmChannel(r.amqpURL, topic)
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close() }()
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, total))
		for k := 0; k < total; k++ {
			o := orderOf(k%r.n, cmp.Or(r.customers, customers))
			if err := ch.PublishWithContext(ctx, "", topic, false, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, Body: payload(o),
				Headers: amqp.Table{"event_id": fmt.Sprintf("evt-%d", o.OrderID)},
			}); err != nil {
				return err
			}
		}
		for range total {
			if c := <-confirms; !c.Ack {
				return errors.New("publish nacked")
			}
		}
		return nil
	case "kafka":
		cl, err := kgo.NewClient(kgo.SeedBrokers(r.kafkaAddr), kgo.ProducerLinger(0))
		if err != nil {
			return err
		}
		defer cl.Close()
		if _, err := kadm.NewClient(cl).CreateTopic(ctx, int32(r.concurrency), 1, nil, topic); err != nil {
			return err
		}
		recs := make([]*kgo.Record, total)
		for k := range recs {
			o := orderOf(k%r.n, cmp.Or(r.customers, customers))
			recs[k] = &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint(o.OrderID)), Value: payload(o),
				Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte(fmt.Sprintf("evt-%d", o.OrderID))}}}
		}
		return cl.ProduceSync(ctx, recs...).FirstErr()
	}
	return fmt.Errorf("unknown broker %q", r.broker)
}

// confirmChannel declares queue (durable, as the adapter does) and returns
// a channel in publisher-confirm mode on a connection of its own.
func confirmChannel(url, queue string) (*amqp.Connection, *amqp.Channel, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
	}
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

func deleteQueue(url, name string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return
	}
	defer func() { _ = conn.Close() }()
	if ch, err := conn.Channel(); err == nil {
		_, _ = ch.QueueDelete(name, false, false, false)
	}
}

// runBatch is mode (d): the same claim + effect through a batch consumer
// (consumer.NewBatch) with a set-wise effect, one transaction per batch of up to batchWindow
// messages, r.workers batches at once. The brokers' windows let the
// subscriber hold enough unacked messages to fill them: RabbitMQ one
// consumer with prefetch workers × batchWindow, Kafka batchWindow per
// partition over as many partitions as per-message mode has.
func runBatch(ctx context.Context, e *env, r routerRun) (result, error) {
	r.concurrency = r.workers
	if err := prepublish(ctx, e, r); err != nil {
		return result{}, fmt.Errorf("publish: %w", err)
	}
	if r.preclaimed {
		if err := preclaim(ctx, e, r.n); err != nil {
			return result{}, err
		}
	}
	if r.broker == "amqp" {
		defer deleteQueue(r.amqpURL, e.topic)
	}
	cfg := r.brokerConfig(e.topic)
	cfg.AMQP.Window = r.workers * batchWindow
	cfg.Kafka.Window = batchWindow
	ph := newPhases(r.n, r.passes())
	lat := make([]time.Duration, r.n)
	onOutcome := func(res middleware.Result) {
		if res.Outcome != framework.Applied && res.Outcome != framework.Duplicate {
			return
		}
		// A batch of duplicates never calls the handler: the clock
		// starts with the first message's processing then.
		ph.firstStart.CompareAndSwap(0, time.Now().Add(-res.Duration).UnixNano())
		if i := ph.settled(); i > 0 && int(i) <= r.n {
			lat[i-1] = res.Duration
		}
	}
	var calls atomic.Int64
	handler := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		ph.firstStart.CompareAndSwap(0, time.Now().UnixNano())
		calls.Add(1)
		return effectSet(ctx, tx, msgs)
	}
	c, err := consumer.NewBatch(ctx, consumer.Config{
		Name: "bench", Topic: e.topic, Key: keySpec,
		Pool: e.pool, Store: store.Config{Schema: e.schema}, Broker: cfg,
		OnOutcome: onOutcome, Logger: slog.New(slog.DiscardHandler),
		Claim: middleware.Claim{NoPositions: *noPositions},
	}, handler, consumer.BatchOptions{MaxSize: batchWindow, Workers: r.workers})
	if err != nil {
		return result{}, err
	}
	defer func() { _ = c.Close() }()
	end, err := runUntil(ctx, ph, "batch consumer", c.Run)
	if err != nil {
		return result{}, err
	}
	return result{n: r.n, elapsed: end.Sub(ph.start()), lat: lat, batches: int(calls.Load())}, nil
}

const batchWindow = 128
