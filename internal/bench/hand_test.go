//go:build bench

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// handPrefetch is the QoS prefetch count of each hand-written RabbitMQ
// channel: the channel works on one delivery at a time, as a watermill-amqp
// subscription does, and (b)/(c) run with the adapter's default prefetch 1,
// so (h) uses the same and c/h compares the consumers, not the windows.
const handPrefetch = 1

// handCommitInterval is how often the hand-written Kafka consumer commits
// its marked offsets, the Kafka adapter's default commit interval that
// (b)/(c) run with.
const handCommitInterval = time.Second

// runHand is mode (h): the claim and effect of (c), written by hand against
// the broker's own client, without Watermill or claimtx. Per message: decode
// the order, then one transaction [BEGIN; claim INSERT ... ON CONFLICT DO
// NOTHING] (one pipelined batch, as (a)), and when the claim row was
// inserted, the balance upsert and the ledger INSERT, then COMMIT; only then
// ack (RabbitMQ) or mark the offset for commit (Kafka). A duplicate (claim
// row already there) commits without the effect and is acked all the same.
//
// After the run it checks that every message was applied exactly once
// (claims, ledger rows and balances in the database) and that nothing was
// left unacked on RabbitMQ or uncommitted on Kafka.
func runHand(ctx context.Context, e *env, r routerRun) (result, error) {
	if err := prepublish(ctx, e, r); err != nil {
		return result{}, fmt.Errorf("publish: %w", err)
	}
	h := &handRun{e: e, n: r.n, lat: make([]time.Duration, r.n), ph: newPhases(r.n, 1), failed: make(chan struct{})}
	var res result
	var err error
	switch r.broker {
	case "amqp":
		defer deleteQueue(r.amqpURL, e.topic)
		res, err = h.runAMQP(ctx, r)
	case "kafka":
		res, err = h.runKafka(ctx, r)
	default:
		return result{}, fmt.Errorf("unknown broker %q", r.broker)
	}
	if err != nil {
		return result{}, err
	}
	if err := h.verify(ctx); err != nil {
		return result{}, fmt.Errorf("check: %w", err)
	}
	return res, nil
}

// handRun is the state of one hand-written run, shared by its workers.
type handRun struct {
	e        *env
	n        int
	lat      []time.Duration
	ph       *phases      // messages handled and acked/marked
	applied  atomic.Int64 // of which the claim row was inserted
	failOnce sync.Once
	failErr  error // set before failed is closed
	failed   chan struct{}
}

func (h *handRun) fail(err error) {
	h.failOnce.Do(func() {
		h.failErr = err
		close(h.failed)
	})
}

// err is the first failure, if any.
func (h *handRun) err() error {
	select {
	case <-h.failed:
		return h.failErr
	default:
		return nil
	}
}

// handle processes one message and calls ack once its transaction has
// committed. Its latency, like the router middleware's in (b)/(c), is the
// handling (decode, transaction) without the ack.
func (h *handRun) handle(ctx context.Context, body []byte, ack func() error) error {
	t0 := time.Now()
	h.ph.firstStart.CompareAndSwap(0, t0.UnixNano())
	var o order
	if err := json.Unmarshal(body, &o); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	claimed, err := rawClaimEffect(ctx, h.e, o)
	if err != nil {
		return err
	}
	took := time.Since(t0)
	if err := ack(); err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	if claimed {
		h.applied.Add(1)
	}
	if i := int(h.ph.settled()); i <= h.n {
		h.lat[i-1] = took
	}
	return nil
}

// wait blocks until n messages were handled, a worker failed or the run
// timed out.
func (h *handRun) wait() error {
	select {
	case <-h.ph.finished:
		return nil
	case <-h.failed:
		return h.failErr
	case <-time.After(5 * time.Minute):
		return errors.New("timed out")
	}
}

func (h *handRun) result() result {
	// The end is when the n-th message settled.
	return result{n: h.n, elapsed: time.Unix(0, h.ph.boundary.Load()).Sub(h.ph.start()), lat: h.lat}
}

// runAMQP consumes with amqp091 directly: one connection, one channel and
// consumer per unit of concurrency (as the adapter's subscriptions in
// (b)/(c)), QoS prefetch handPrefetch, manual acks, each channel's
// deliveries handled in order by its own goroutine.
func (h *handRun) runAMQP(ctx context.Context, r routerRun) (result, error) {
	conn, err := amqp.Dial(r.amqpURL)
	if err != nil {
		return result{}, err
	}
	defer func() { _ = conn.Close() }()
	type consumer struct {
		ch  *amqp.Channel
		tag string
	}
	var consumers []consumer
	var wg sync.WaitGroup
	for w := 0; w < r.concurrency; w++ {
		ch, err := conn.Channel()
		if err != nil {
			return result{}, err
		}
		if err := ch.Qos(handPrefetch, 0, false); err != nil {
			return result{}, err
		}
		tag := fmt.Sprintf("bench-hand-%d", w)
		deliveries, err := ch.Consume(h.e.topic, tag, false, false, false, false, nil)
		if err != nil {
			return result{}, err
		}
		consumers = append(consumers, consumer{ch, tag})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range deliveries {
				if h.err() != nil {
					_ = d.Nack(false, true)
					continue
				}
				if err := h.handle(ctx, d.Body, func() error { return d.Ack(false) }); err != nil {
					_ = d.Nack(false, true)
					h.fail(err)
				}
			}
		}()
	}
	waitErr := h.wait()
	// Stop consuming, let each goroutine finish the delivery it holds, then
	// close the channels: once Close returns, RabbitMQ has processed every
	// ack sent on them and requeued whatever they left unacked.
	for _, c := range consumers {
		_ = c.ch.Cancel(c.tag, false)
	}
	wg.Wait()
	for _, c := range consumers {
		if err := c.ch.Close(); err != nil && waitErr == nil {
			waitErr = fmt.Errorf("close channel: %w", err)
		}
	}
	if waitErr != nil {
		return result{}, waitErr
	}
	if err := h.err(); err != nil {
		return result{}, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return result{}, err
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(h.e.topic, true, false, false, false, nil)
	if err != nil {
		return result{}, err
	}
	if q.Messages != 0 {
		return result{}, fmt.Errorf("check: %d messages left in the queue (unacked or not consumed)", q.Messages)
	}
	return h.result(), nil
}

// runKafka consumes with a franz-go consumer group: one goroutine per
// assigned partition handles that partition's records in order, marking
// each record for commit after its transaction committed; the marked
// offsets are committed every handCommitInterval, when partitions are
// revoked and at the end (AutoCommitMarks). Polling blocks rebalances
// (BlockRebalanceOnPoll) until the poll's records are handed to the
// partition goroutines, so a revoke stops a partition's goroutine and
// commits its marks before another member could get the partition.
func (h *handRun) runKafka(ctx context.Context, r routerRun) (result, error) {
	group := "bench-" + h.e.topic
	p := &partitions{h: h, ctx: ctx, byTP: map[topicPartition]*partitionWorker{}}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(r.kafkaAddr),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(h.e.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(handCommitInterval),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(p.assigned),
		kgo.OnPartitionsRevoked(p.revoked),
		kgo.OnPartitionsLost(p.lost),
	)
	if err != nil {
		return result{}, err
	}
	closed := false
	defer func() {
		if !closed {
			cl.CloseAllowingRebalance()
		}
	}()
	pctx, stopPoll := context.WithCancel(ctx)
	defer stopPoll()
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			fetches := cl.PollFetches(pctx)
			if pctx.Err() != nil || fetches.IsClientClosed() {
				cl.AllowRebalance()
				return
			}
			fetches.EachError(func(t string, part int32, err error) {
				h.fail(fmt.Errorf("fetch %s/%d: %w", t, part, err))
			})
			fetches.EachPartition(func(ftp kgo.FetchTopicPartition) {
				if len(ftp.Records) == 0 {
					return
				}
				w := p.worker(topicPartition{ftp.Topic, ftp.Partition})
				if w == nil {
					return // not ours (any more): not handled, not marked
				}
				select {
				case w.recs <- ftp.Records:
				case <-w.quit:
				case <-pctx.Done():
				}
			})
			cl.AllowRebalance()
		}
	}()
	waitErr := h.wait()
	stopPoll()
	<-polled
	// Stop the partition goroutines (each finishes the record it holds),
	// commit what they marked, leave the group.
	p.stopAll()
	commitErr := cl.CommitMarkedOffsets(ctx)
	cl.CloseAllowingRebalance()
	closed = true
	if waitErr != nil {
		return result{}, waitErr
	}
	if err := h.err(); err != nil {
		return result{}, err
	}
	if commitErr != nil {
		return result{}, fmt.Errorf("commit: %w", commitErr)
	}
	if err := checkCommitted(ctx, r.kafkaAddr, group, h.e.topic); err != nil {
		return result{}, fmt.Errorf("check: %w", err)
	}
	return h.result(), nil
}

type topicPartition struct {
	topic     string
	partition int32
}

// partitionWorker is the goroutine handling one assigned partition.
type partitionWorker struct {
	recs     chan []*kgo.Record
	quit     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

func (w *partitionWorker) stop() {
	w.stopOnce.Do(func() { close(w.quit) })
	<-w.done
}

// partitions tracks the partition goroutines across rebalances.
type partitions struct {
	h    *handRun
	ctx  context.Context
	mu   sync.Mutex
	byTP map[topicPartition]*partitionWorker
}

func (p *partitions) worker(tp topicPartition) *partitionWorker {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byTP[tp]
}

func (p *partitions) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for topic, parts := range assigned {
		for _, part := range parts {
			w := &partitionWorker{recs: make(chan []*kgo.Record, 4), quit: make(chan struct{}), done: make(chan struct{})}
			p.byTP[topicPartition{topic, part}] = w
			go p.consume(cl, w)
		}
	}
}

func (p *partitions) consume(cl *kgo.Client, w *partitionWorker) {
	defer close(w.done)
	for {
		select {
		case <-w.quit:
			return
		case recs := <-w.recs:
			for _, rec := range recs {
				select {
				case <-w.quit:
					return
				default:
				}
				if p.h.err() != nil {
					return
				}
				err := p.h.handle(p.ctx, rec.Value, func() error {
					cl.MarkCommitRecords(rec)
					return nil
				})
				if err != nil {
					// Not marked: the record is redelivered to whoever
					// owns the partition next.
					p.h.fail(err)
					return
				}
			}
		}
	}
}

// stop ends the goroutines of the given partitions (nil: all) and forgets
// them.
func (p *partitions) stop(which map[string][]int32) {
	p.mu.Lock()
	var ws []*partitionWorker
	for tp, w := range p.byTP {
		if which != nil && !slices.Contains(which[tp.topic], tp.partition) {
			continue
		}
		ws = append(ws, w)
		delete(p.byTP, tp)
	}
	p.mu.Unlock()
	for _, w := range ws {
		w.stop()
	}
}

func (p *partitions) stopAll() { p.stop(nil) }

func (p *partitions) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	p.stop(revoked)
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		p.h.fail(fmt.Errorf("commit on revoke: %w", err))
	}
}

func (p *partitions) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	p.stop(lost) // too late to commit: the next owner redoes the unmarked tail, the claims skip it
}

// checkCommitted verifies the group's committed offset of every partition
// of topic is the partition's end: no record left uncommitted.
func checkCommitted(ctx context.Context, addr, group, topic string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return err
	}
	if err := ends.Error(); err != nil {
		return err
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return err
	}
	if err := committed.Error(); err != nil {
		return err
	}
	var bad []string
	ends.Each(func(end kadm.ListedOffset) {
		c, ok := committed.Lookup(topic, end.Partition)
		switch {
		case !ok && end.Offset > 0:
			bad = append(bad, fmt.Sprintf("partition %d: nothing committed, end %d", end.Partition, end.Offset))
		case ok && c.At != end.Offset:
			bad = append(bad, fmt.Sprintf("partition %d: committed %d, end %d", end.Partition, c.At, end.Offset))
		}
	})
	if len(bad) > 0 {
		return fmt.Errorf("offsets not committed to the end: %v", bad)
	}
	return nil
}

// verify checks the database after a run: n messages handled, each claimed
// and applied once (n claims, n ledger rows, n distinct orders, the
// balances adding up to the orders' points).
func (h *handRun) verify(ctx context.Context) error {
	if a := h.applied.Load(); a != int64(h.n) {
		return fmt.Errorf("%d of %d messages applied (%d duplicates)", a, h.n, h.ph.done.Load()-a)
	}
	return exactlyOnce(ctx, h.e.pool, h.n)
}

// exactlyOnce checks the database after a run of n messages: each claimed
// and applied once (n claims, n ledger rows, n distinct orders, the
// balances adding up to the orders' points).
func exactlyOnce(ctx context.Context, pool *pgxpool.Pool, n int) error {
	var wantPoints int64
	for i := 0; i < n; i++ {
		wantPoints += orderN(i).TotalCents / 100
	}
	var claims, ledger, orders, points int64
	if err := pool.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM processed_messages),
	(SELECT count(*) FROM point_ledger),
	(SELECT count(DISTINCT order_id) FROM point_ledger),
	(SELECT coalesce(sum(points), 0)::bigint FROM balances)`).Scan(&claims, &ledger, &orders, &points); err != nil {
		return err
	}
	if claims != int64(n) || ledger != int64(n) || orders != int64(n) || points != wantPoints {
		return fmt.Errorf("want %d claims, ledger rows and orders and %d points; got %d claims, %d ledger rows, %d orders, %d points",
			n, wantPoints, claims, ledger, orders, points)
	}
	return nil
}
