package kafka

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/internal/defaults"
	"github.com/claimtx/claimtx/brokers/internal/wait"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/kafkarecord"
)

type subscriber struct {
	cfg    brokers.KafkaConfig
	sc     *sarama.Config // readiness probe and credential check (health.go, auth.go)
	logger watermill.LoggerAdapter
	// IsConnected's cached probe (health.go); connMu is held during a
	// probe, so concurrent callers share it.
	connMu sync.Mutex
	connAt time.Time
	connOK bool

	positions kafkarecord.Options // stored positions, attached before Subscribe (positions.go)

	// life ends when Close starts, and with it every subscription; mu
	// orders Subscribe's subs.Add before Close's Wait.
	mu   sync.Mutex
	life context.Context
	end  context.CancelFunc
	subs sync.WaitGroup
}

var errSubscriberClosed = errors.New("subscriber closed")

// NewSubscriber validates cfg and returns a subscriber that consumes with a
// franz-go consumer group, up to Window messages in flight per partition
// (package documentation, "Delivery"). It does not connect (ctx is there so
// that the adapters' constructors read alike): each Subscribe opens its own
// client. A nil logger logs nothing. An invalid cfg, including an empty
// ConsumerGroup, is a *framework.ConfigError. The subscriber also has
// IsConnected (readiness, observe.SubscriberConnected) and ReplayHorizon
// (see brokers.UnboundedHorizon).
func NewSubscriber(ctx context.Context, cfg brokers.KafkaConfig, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	sc, err := saramaConfig(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.ConsumerGroup == "" { // only a subscriber needs one
		return nil, &framework.ConfigError{Field: "consumer_group", Reason: "must not be empty for a subscriber: set KAFKA_CONSUMER_GROUP or kafka.consumer_group to a group of this service's own (framework/consumer defaults it to the consumer's Name)"}
	}
	cfg = defaults.Apply(cfg)
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	life, end := context.WithCancel(context.Background())
	return &subscriber{cfg: cfg, sc: sc, logger: logger, life: life, end: end}, nil
}

// closed reports whether Close has begun.
func (s *subscriber) closed() bool { return s.life.Err() != nil }

// closeWait bounds Close's wait: each subscription ends within closeTimeout.
const closeWait = closeTimeout + time.Second

// Close ends every subscription (stop forwarding, commit the acked offsets,
// leave the group, close the channel) and waits for them, at most 6 s: what
// was not committed is delivered again. It is idempotent.
func (s *subscriber) Close() error {
	s.mu.Lock()
	s.end()
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.subs.Wait()
		close(done)
	}()
	if wait.For(closeWait, done) {
		return fmt.Errorf("brokers/kafka: subscriptions still closing after %s; going on without them (what they did not commit is delivered again)", closeWait)
	}
	return nil
}

// Each Subscribe is a franz-go group client of its own. One poll loop hands
// fetched records to a queue per assigned partition; each partition
// forwards them in order, taking a window slot per record and giving it
// back when the message (its last copy, after nacks) is acked. On revoke or
// loss a partition stops at once: nothing more is forwarded, re-sent or
// marked.

// queueHigh is how many fetched records a partition may hold before its
// fetches pause (one slow partition never stops the others); window-sized
// queues would make each slot wait for a fetch round trip.
const queueHigh = 512

// closeTimeout bounds what ending a subscription waits on the cluster for
// (the final commit, leaving the group): a member that could not leave is
// evicted after its session timeout.
const closeTimeout = 5 * time.Second

// subscription is one Subscribe call's group client and partitions.
type subscription struct {
	s      *subscriber
	topic  string
	cl     *kgo.Client
	out    chan *message.Message
	runCtx context.Context
	window int
	fields watermill.LogFields

	mu    sync.Mutex
	parts map[int32]*partition // assigned partitions
	ended bool                 // the subscription is ending: assign nothing more

	workers  sync.WaitGroup // partition forwarders
	watchers sync.WaitGroup // one per forwarded message until it settles

	// clientSet is closed once cl is set: franz-go may run a group
	// callback before kgo.NewClient returns.
	clientSet chan struct{}
}

// Subscribe joins the consumer group for topic. The first contact with the
// cluster is retried until DialTimeout or ctx ends; after that the client
// reconnects and rejoins on its own. The channel is closed when ctx ends or
// the Subscriber is closed.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	what := fmt.Sprintf("subscribe to %q", topic)
	window := max(s.cfg.Window, 1)
	g := &subscription{s: s, topic: topic, window: window, parts: map[int32]*partition{}, clientSet: make(chan struct{}),
		out:    make(chan *message.Message), // unbuffered: nothing read ahead beyond the window
		fields: watermill.LogFields{"provider": "kafka", "topic": topic, "consumer_group": s.cfg.ConsumerGroup, "window": window},
	}
	opts, err := groupOpts(s.cfg, topic)
	if err != nil {
		return nil, err
	}
	opts = append(opts,
		kgo.WithLogger(kgoLogger{logger: s.logger, fields: g.fields}),
		kgo.OnPartitionsAssigned(g.assigned),
		kgo.OnPartitionsRevoked(g.revoked),
		kgo.OnPartitionsLost(g.lost),
		kgo.AdjustFetchOffsetsFn(g.adjustOffsets),
	)
	s.mu.Lock()
	if s.closed() {
		s.mu.Unlock()
		return nil, fmt.Errorf("brokers/kafka: %s: %w", what, errSubscriberClosed)
	}
	s.subs.Add(1)
	s.mu.Unlock()
	// runCtx ends with ctx or Close; set before the client starts the
	// group callbacks that read it.
	var cancelRun context.CancelFunc
	g.runCtx, cancelRun = context.WithCancel(ctx)
	stopOnClose := context.AfterFunc(s.life, cancelRun)
	cancel := func() {
		stopOnClose()
		cancelRun()
	}

	cl, err := kgo.NewClient(opts...)
	if err != nil {
		s.subs.Done()
		cancel()
		return nil, clientOptionsError(err)
	}
	g.cl = cl
	close(g.clientSet)
	err = retryStart(ctx, s.cfg, s.logger, what, func() error {
		if s.closed() {
			return errSubscriberClosed
		}
		pctx, pcancel := context.WithTimeout(ctx, probeTimeout*5)
		defer pcancel()
		return cl.Ping(pctx)
	})
	if err != nil {
		cancel()
		go func() {
			defer s.subs.Done()
			g.leave(time.Now().Add(closeTimeout))
		}()
		return nil, err
	}
	s.logger.Info("Subscribing to Kafka topic", g.fields)

	go func() {
		defer s.subs.Done()
		defer cancel()
		g.poll()
		g.end()
		s.logger.Info("Consuming done", g.fields)
	}()
	return g.out, nil
}

// clientOptionsError is a franz-go option the client refused (Validate
// should have caught it first).
func clientOptionsError(err error) error {
	return fmt.Errorf("brokers/kafka: kafka client options: %w", err)
}

// poll hands fetched records to their partitions until runCtx ends. With
// BlockRebalanceOnPoll no rebalance callback runs before AllowRebalance.
func (g *subscription) poll() {
	for {
		fetches := g.cl.PollRecords(g.runCtx, 0)
		if g.runCtx.Err() != nil || fetches.IsClientClosed() {
			g.cl.AllowRebalance()
			return
		}
		failed := false
		fetches.EachError(func(_ string, p int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			failed = true
			g.s.logger.Error("Kafka fetch error", err, g.fields.Add(watermill.LogFields{"kafka_partition": p}))
		})
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			if len(fp.Records) == 0 {
				return
			}
			g.mu.Lock()
			p := g.parts[fp.Partition]
			g.mu.Unlock()
			if p != nil {
				p.push(fp.Records)
			}
		})
		g.cl.AllowRebalance()
		if failed && fetches.NumRecords() == 0 {
			// franz-go retries on its own; this only keeps a broker
			// that keeps failing from filling the log.
			wait.For(g.s.cfg.ReconnectBackoff, g.runCtx.Done())
		}
	}
}

// assigned starts a forwarder for each new partition, before its fetches.
func (g *subscription) assigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	<-g.clientSet
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		return
	}
	for _, id := range assigned[g.topic] {
		if g.parts[id] != nil {
			continue // cannot happen: revoke comes first
		}
		p := &partition{g: g, id: id, slots: make(chan struct{}, g.window), done: make(chan struct{}), wake: make(chan struct{}, 1)}
		g.parts[id] = p
		g.workers.Go(p.run)
	}
	g.s.logger.Debug("Partitions assigned", g.fields.Add(watermill.LogFields{"partitions": fmt.Sprint(assigned[g.topic])}))
}

// revoked stops the partitions that moved and commits their marks, so
// their next owner starts after every acked message.
func (g *subscription) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	<-g.clientSet
	g.stop(revoked[g.topic])
	g.mu.Lock()
	ended := g.ended
	g.mu.Unlock()
	if ended {
		return // end committed already, and the member may have left
	}
	ctx, cancel := context.WithTimeout(ctx, closeTimeout)
	defer cancel()
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		g.s.logger.Info("Kafka commit at revoke failed; the next owner reads those messages again", g.fields.Add(watermill.LogFields{"err": err.Error()}))
	}
}

// lost stops the partitions without committing: they are another's already.
func (g *subscription) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	<-g.clientSet
	g.stop(lost[g.topic])
	g.s.logger.Info("Kafka partitions lost (session ended without a revoke)", g.fields.Add(watermill.LogFields{"partitions": fmt.Sprint(lost[g.topic])}))
}

func (g *subscription) stop(ids []int32) {
	g.mu.Lock()
	var stopped []*partition
	for _, id := range ids {
		if p := g.parts[id]; p != nil {
			delete(g.parts, id)
			stopped = append(stopped, p)
		}
	}
	g.mu.Unlock()
	for _, p := range stopped {
		p.stop()
	}
}

// end stops every partition, commits what was marked, leaves the group and
// closes the channel once nothing can send on it; the waits on the cluster
// share one closeTimeout.
func (g *subscription) end() {
	g.mu.Lock()
	g.ended = true
	ids := slices.Collect(maps.Keys(g.parts))
	g.mu.Unlock()
	// Stopped first, no later ack marks anything: the commit below is this
	// member's last word.
	g.stop(ids)
	deadline := time.Now().Add(closeTimeout)
	if len(ids) > 0 {
		// With no partition the member is joining: the eager revoke
		// committed already, and franz-go holds commits until the join
		// ends.
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(closeTimeout/2))
		if err := g.cl.CommitMarkedOffsets(ctx); err != nil {
			g.s.logger.Info("Kafka final commit failed; those messages are delivered again", g.fields.Add(watermill.LogFields{"err": err.Error()}))
		}
		cancel()
	}
	g.leave(deadline)
	// No forwarder runs, so no watcher starts; those left see runCtx end.
	g.workers.Wait()
	g.watchers.Wait()
	close(g.out)
}

// leaveNudge is how long leave lets franz-go leave by itself.
const leaveNudge = 250 * time.Millisecond

// leave leaves the group and closes the client, until deadline at most.
//
// franz-go does not interrupt a JoinGroup or SyncGroup in flight when it
// leaves, and the coordinator may hold a join up to RebalanceTimeout: a
// member stopped while joining would stay in the group and get partitions
// it never consumes. So after leaveNudge leave sends the LeaveGroup itself;
// the coordinator removes the member at once (a real broker also answers
// the join with UNKNOWN_MEMBER_ID; kfake does not, and the client goes on
// closing in the background).
func (g *subscription) leave(deadline time.Time) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	memberID, _ := g.cl.GroupMetadata()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := g.cl.LeaveGroupContext(ctx); err != nil {
			g.s.logger.Debug("Leaving the Kafka group did not finish", g.fields.Add(watermill.LogFields{"err": err.Error()}))
		}
		g.cl.Close()
	}()
	if !wait.For(leaveNudge, done) {
		return
	}
	if memberID != "" {
		req := &kmsg.LeaveGroupRequest{Group: g.s.cfg.ConsumerGroup, MemberID: memberID, Members: []kmsg.LeaveGroupRequestMember{
			{MemberID: memberID, Reason: kmsg.StringPtr("claimtx subscriber closing while the group rebalances")},
		}}
		if _, err := req.RequestWith(ctx, g.cl); err != nil {
			g.s.logger.Info("Sending LeaveGroup failed; the group evicts this member after its session timeout", g.fields.Add(watermill.LogFields{"err": err.Error()}))
		} else {
			// Out of the group: only the client's goroutines are left,
			// which kfake holds until the join times out.
			g.s.logger.Debug("Left the Kafka group while a join was in flight", g.fields.Add(watermill.LogFields{"member_id": memberID}))
			if wait.For(leaveNudge, done) {
				g.s.logger.Debug("Kafka client still closing; going on without it", g.fields)
			}
			return
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
		g.s.logger.Debug("Kafka client still closing; going on without it", g.fields)
	}
}

// partition is one assigned partition of a subscription.
type partition struct {
	g     *subscription
	id    int32
	slots chan struct{} // window semaphore: one token per unacked message
	done  chan struct{} // closed by stop
	wake  chan struct{} // a push for a waiting forwarder (capacity 1)

	mu      sync.Mutex
	stopped bool
	queue   []*kgo.Record // fetched, not forwarded yet
	paused  bool          // fetches paused because queue is full
	unacked list.List     // *kgo.Record forwarded and not acked yet, ascending offsets
	last    *kgo.Record   // latest record forwarded
}

func (p *partition) tp() map[string][]int32 { return map[string][]int32{p.g.topic: {p.id}} }

// push queues fetched records, pausing the partition's fetches when the
// queue is full.
func (p *partition) push(recs []*kgo.Record) {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.queue = append(p.queue, recs...)
	if len(p.queue) >= queueHigh && !p.paused {
		p.paused = true
		p.g.cl.PauseFetchPartitions(p.tp())
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// next takes the next queued record, waiting for one; false once stopped.
func (p *partition) next() (*kgo.Record, bool) {
	for {
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			return nil, false
		}
		if len(p.queue) > 0 {
			r := p.queue[0]
			p.queue[0] = nil
			p.queue = p.queue[1:]
			if p.paused && len(p.queue) <= queueHigh/2 {
				p.paused = false
				p.g.cl.ResumeFetchPartitions(p.tp())
			}
			p.mu.Unlock()
			return r, true
		}
		p.mu.Unlock()
		select {
		case <-p.wake:
		case <-p.done:
			return nil, false
		}
	}
}

// run forwards the partition's records, one window slot each, until stop.
func (p *partition) run() {
	for {
		select {
		case p.slots <- struct{}{}:
		case <-p.done:
			return
		}
		rec, ok := p.next()
		if !ok {
			return
		}
		msg := unmarshalRecord(rec)
		ctx, cancel := context.WithCancel(kafkarecord.NewContext(p.g.runCtx,
			kafkarecord.Record{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Of: p, Window: p.g.window}))
		msg.SetContext(ctx)
		e := p.track(rec)
		select {
		case p.g.out <- msg:
		case <-p.done:
			cancel()
			return
		}
		p.g.watchers.Go(func() { p.watch(msg, e, ctx, cancel) })
	}
}

// unmarshalRecord never fails: a record that cannot be read as a message
// would stop its partition for good.
func unmarshalRecord(r *kgo.Record) *message.Message {
	return kafkarecord.KafkaMessage(r.Topic, r.Partition, r.Offset, r.Key, r.Value, r.Timestamp, r.Headers,
		func(h kgo.RecordHeader) (string, []byte, bool) { return h.Key, h.Value, true })
}

// track records a forwarded record, in offset order.
func (p *partition) track(r *kgo.Record) *list.Element {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = r
	return p.unacked.PushBack(r)
}

// ack drops e from the unacked records, marks the next offset to consume
// (the lowest unacked one, or one past the latest forwarded: gaps hold no
// records we were given, such as transaction markers) and frees e's window
// slot. After stop it marks nothing: the partition may be another
// member's.
func (p *partition) ack(e *list.Element) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	wasFirst := p.unacked.Front() == e
	p.unacked.Remove(e)
	if wasFirst {
		next := kgo.EpochOffset{Epoch: p.last.LeaderEpoch, Offset: p.last.Offset + 1}
		if f := p.unacked.Front(); f != nil {
			r := f.Value.(*kgo.Record)
			next = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset}
		}
		p.g.cl.MarkCommitOffsets(map[string]map[int32]kgo.EpochOffset{p.g.topic: {p.id: next}})
		p.g.s.settled(p.g.topic, p.id, next.Offset)
	}
	<-p.slots // e holds a slot, so this never blocks
}

// watch follows one forwarded message until it is acked, re-sending a fresh
// copy after each nack, then cancels its context. Once the partition
// stopped it only waits for the consumer to settle the message (or the
// subscription to end) before it cancels the context.
func (p *partition) watch(msg *message.Message, e *list.Element, ctx context.Context, cancel context.CancelFunc) {
	defer cancel()
	for {
		select {
		case <-msg.Acked():
			p.ack(e)
			return
		case <-msg.Nacked():
		case <-p.done:
			select {
			case <-msg.Acked():
			case <-msg.Nacked():
			case <-ctx.Done():
			}
			return
		}
		if !wait.For(p.g.s.cfg.NackDelay, p.done) {
			return
		}
		msg = msg.Copy() // a Watermill message settles once
		msg.SetContext(ctx)
		select {
		case p.g.out <- msg:
		case <-p.done:
			return
		}
	}
}

// stop ends the partition. A paused partition is resumed, so that it is
// fetched again if it comes back.
func (p *partition) stop() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.stopped = true
	p.queue = nil
	p.unacked.Init()
	if p.paused {
		p.paused = false
		p.g.cl.ResumeFetchPartitions(p.tp())
	}
	p.mu.Unlock()
	close(p.done)
}
