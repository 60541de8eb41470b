package kafka

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/internal/wait"
	"github.com/claimtx/claimtx/internal/kafkarecord"
)

// Subscriber consumes with a franz-go consumer group (brokers.KafkaConfig.ConsumerGroup).
// Each partition has at most brokers.KafkaConfig.Window messages in flight (one by
// default); an ack marks its offset once every earlier message of the
// partition is acked, and marks are committed every brokers.KafkaConfig.CommitInterval
// (see "Consuming" below).
type Subscriber struct {
	cfg    brokers.KafkaConfig
	sc     *sarama.Config // readiness probe and credential check (health.go, auth.go)
	logger watermill.LoggerAdapter
	conn   connState // IsConnected's cached probe (health.go)

	positions kafkarecord.Options // stored positions, attached before Subscribe (positions.go)

	// life ends when Close starts, and with it every subscription; mu
	// orders subs.Add in Subscribe against Close's Wait.
	mu   sync.Mutex
	life context.Context
	end  context.CancelFunc
	subs sync.WaitGroup
}

var errSubscriberClosed = errors.New("subscriber closed")

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber validates cfg and returns a Subscriber. It does not
// connect, so ctx is not used yet; it is there so that both constructors
// of both adapters read alike and a later version may dial here. Each
// Subscribe call opens its own client (and retries, see
// brokers.KafkaConfig.DialTimeout). A nil logger logs nothing. An invalid cfg,
// including an empty ConsumerGroup, is a *framework.ConfigError.
func NewSubscriber(ctx context.Context, cfg brokers.KafkaConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	sc, err := saramaConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := validateSubscriber(cfg); err != nil {
		return nil, err
	}
	cfg = withDefaults(cfg)
	if _, err := groupOpts(cfg, "validate"); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	life, end := context.WithCancel(context.Background())
	return &Subscriber{cfg: cfg, sc: sc, logger: logger, life: life, end: end}, nil
}

// closed reports whether Close has begun.
func (s *Subscriber) closed() bool { return s.life.Err() != nil }

// closeWait bounds Close's wait for the subscriptions: each ends within
// closeTimeout once its consumer let go of the messages it holds.
const closeWait = closeTimeout + time.Second

// Close ends every subscription: it stops forwarding, commits the offsets
// of acked messages, leaves the group and waits for the subscriptions to
// close their channels, at most 6 s (a cluster that does not answer
// cannot hold it longer; what was not committed is delivered again). It is
// idempotent.
func (s *Subscriber) Close() error {
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

// Consuming (one subscription per Subscribe call).
//
// Each subscription is a franz-go consumer-group client of its own. Under
// rolling restarts that mix crashes with graceful stops, Sarama's consumer
// group (which watermill-kafka and the earlier window mode used) stopped
// consuming for good: its JoinGroup waits Net.ReadTimeout (30 s) whatever
// the rebalance timeout is, takes no context, and a member stuck in it
// could neither join nor leave, so neither the group nor a SIGTERM made
// progress. franz-go waits RebalanceTimeout + groupRequestMargin for group
// answers, and leaving the group cancels a join in flight.
//
//   - One poll loop hands fetched records to a queue per assigned
//     partition. A queue past queueHigh pauses that partition's fetches
//     (one slow partition never stops the others) and resumes them when it
//     drained to half. With BlockRebalanceOnPoll, rebalance callbacks never
//     run between a poll and that hand-off.
//   - Each partition forwards its records in order through a semaphore of
//     window slots (brokers.KafkaConfig.Window, or 1: the one message in flight per
//     partition watermill-kafka has). A slot is taken before a record is
//     forwarded and given back when its message (the last copy, after
//     nacks) is acked.
//   - Forwarded offsets not acked yet are kept in order. An ack of the lowest
//     marks the next lowest (or the one after the latest forwarded record),
//     so the committed offset never passes an unacked message; marks are
//     committed every brokers.KafkaConfig.CommitInterval, when partitions are revoked and
//     when the subscription ends.
//   - A nack re-sends a fresh copy (Watermill messages can be acked only
//     once) after brokers.KafkaConfig.NackDelay; its slot stays taken, later messages of
//     the partition go on (with one slot, they wait: Kafka order).
//   - On revoke (or loss) a partition stops at once: nothing more is
//     forwarded, re-sent or marked. The rebalance does not wait for
//     outstanding acks: their messages are delivered again from the
//     committed offset to whoever owns the partition next, where the claim
//     table turns them into duplicates. Work in progress may still finish:
//     a message's context is cancelled once it is acked or the subscription
//     ends, not when its partition moves.

// queueHigh is how many fetched records a partition may hold before its
// fetches pause; window-sized queues would make each slot wait for a
// fetch round trip.
const queueHigh = 512

// closeTimeout bounds what ending a subscription waits on the cluster for
// (the final commit, leaving the group). A broker that does not
// answer must not hold a shutdown: what was not committed is delivered
// again, and a member that could not leave is evicted after its session
// timeout.
const closeTimeout = 5 * time.Second

// subscription is one Subscribe call's group client and partitions.
type subscription struct {
	s      *Subscriber
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

	// clientSet is closed once cl is set. franz-go starts joining the
	// group inside kgo.NewClient, so a group callback can run before
	// NewClient has returned the client the callbacks use.
	clientSet chan struct{}
}

// Subscribe joins the consumer group for topic. The first contact with the
// cluster is retried until brokers.KafkaConfig.DialTimeout or ctx ends; after that, the
// client reconnects and rejoins on its own. The channel is closed when ctx
// ends or the Subscriber is closed.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	what := fmt.Sprintf("subscribe to %q", topic)
	g := &subscription{
		s:         s,
		topic:     topic,
		out:       make(chan *message.Message), // unbuffered: nothing read ahead beyond the window
		clientSet: make(chan struct{}),
		window:    max(s.cfg.Window, 1),
		parts:     map[int32]*partition{},
		fields: watermill.LogFields{
			"provider":       "kafka",
			"topic":          topic,
			"consumer_group": s.cfg.ConsumerGroup,
			"window":         max(s.cfg.Window, 1),
		},
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
	// Close ends s.life under mu before it waits: no subscription starts
	// once Close is waiting.
	s.mu.Lock()
	if s.closed() {
		s.mu.Unlock()
		return nil, fmt.Errorf("brokers/kafka: %s: %w", what, errSubscriberClosed)
	}
	s.subs.Add(1)
	s.mu.Unlock()
	// runCtx ends with ctx or when the Subscriber closes; it is set before
	// the client starts the group callbacks that read it.
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
		return nil, &configError{err}
	}
	g.cl = cl
	close(g.clientSet)
	err = retryStart(ctx, s.cfg, s.logger, what, func() error {
		if s.closed() {
			return errPermanent{errSubscriberClosed}
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

// configError is a franz-go option the client refused: brokers.KafkaConfig.Validate
// should have caught it first.
type configError struct{ error }

func (e *configError) Error() string {
	return "brokers/kafka: kafka client options: " + e.error.Error()
}
func (e *configError) Unwrap() error { return e.error }

// poll hands fetched records to their partitions until the subscription's
// context ends.
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

// assigned starts a forwarder for each new partition (franz-go calls it
// before it fetches them).
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
		p := &partition{
			g:     g,
			id:    id,
			slots: make(chan struct{}, g.window),
			done:  make(chan struct{}),
			wake:  make(chan struct{}, 1),
		}
		g.parts[id] = p
		g.workers.Add(1)
		go p.run()
	}
	g.s.logger.Debug("Partitions assigned", g.fields.Add(watermill.LogFields{"partitions": fmt.Sprint(assigned[g.topic])}))
}

// revoked stops the partitions that moved and commits what was marked on
// them, so their next owner starts after every acked message.
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

// lost stops the partitions without committing: the group already gave
// them to another member.
func (g *subscription) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	<-g.clientSet
	g.stop(lost[g.topic])
	g.s.logger.Info("Kafka partitions lost (session ended without a revoke)", g.fields.Add(watermill.LogFields{"partitions": fmt.Sprint(lost[g.topic])}))
}

// stop ends the given partitions.
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

// end is the subscription's last step: stop every partition, commit what
// was marked, leave the group, and close the channel once nothing can send
// on it any more. The waits on the cluster share one closeTimeout.
func (g *subscription) end() {
	g.mu.Lock()
	g.ended = true
	ids := make([]int32, 0, len(g.parts))
	for id := range g.parts {
		ids = append(ids, id)
	}
	g.mu.Unlock()
	// Stop before the commit: an ack that comes later marks nothing, so
	// the commit below is the last word on this member's offsets.
	g.stop(ids)
	deadline := time.Now().Add(closeTimeout)
	if len(ids) > 0 {
		// With no partition assigned the member is joining (the eager
		// revoke before a join committed its marks already), and
		// franz-go holds commits until the join ends: nothing to wait
		// for.
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(closeTimeout/2))
		if err := g.cl.CommitMarkedOffsets(ctx); err != nil {
			g.s.logger.Info("Kafka final commit failed; those messages are delivered again", g.fields.Add(watermill.LogFields{"err": err.Error()}))
		}
		cancel()
	}
	g.leave(deadline)
	// No forwarder runs any more, so no watcher starts; the watchers left
	// see runCtx ended and return.
	g.workers.Wait()
	g.watchers.Wait()
	close(g.out)
}

// leaveNudge is how long leave lets franz-go leave the group by itself
// before it sends the LeaveGroup itself.
const leaveNudge = 250 * time.Millisecond

// leave leaves the group and closes the client, waiting until deadline at
// most.
//
// franz-go does not interrupt a JoinGroup or SyncGroup in flight when it
// leaves (so that a final commit in the revoke callback can still succeed),
// and the coordinator may hold a join until the rebalance ends, up to
// RebalanceTimeout. A member stopped while it joins would then stay in the
// group, counted as joined, and get partitions it will never consume. So
// when franz-go has not left within leaveNudge, leave sends the LeaveGroup
// for the member itself: the coordinator removes it at once, and the
// rebalance goes on without it. (A real broker also answers the pending
// join then, with UNKNOWN_MEMBER_ID, and franz-go finishes closing; kfake
// does not, and the client goes on closing in the background.)
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
		req := kmsg.NewPtrLeaveGroupRequest()
		req.Group = g.s.cfg.ConsumerGroup
		req.MemberID = memberID
		m := kmsg.NewLeaveGroupRequestMember()
		m.MemberID = memberID
		reason := "claimtx subscriber closing while the group rebalances"
		m.Reason = &reason
		req.Members = append(req.Members, m)
		if _, err := req.RequestWith(ctx, g.cl); err != nil {
			g.s.logger.Info("Sending LeaveGroup failed; the group evicts this member after its session timeout", g.fields.Add(watermill.LogFields{"err": err.Error()}))
		} else {
			// Out of the group: nothing is left to wait for but the
			// client's goroutines, which a broker that never answers
			// the join (kfake) holds until the request times out.
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
	defer p.g.workers.Done()
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
		p.g.watchers.Add(1)
		go p.watch(msg, e, ctx, cancel)
	}
}

// unmarshalRecord converts a record as the package documentation
// ("Plain producers and metadata") describes. It never fails: a record
// that cannot be read as a message would stop its partition for good.
func unmarshalRecord(r *kgo.Record) *message.Message {
	return kafkarecord.KafkaMessage(r.Topic, r.Partition, r.Offset, r.Key, r.Value, r.Timestamp, r.Headers,
		func(h kgo.RecordHeader) (string, []byte, bool) { return h.Key, h.Value, true })
}

// track records a forwarded record. Records arrive in offset order.
func (p *partition) track(r *kgo.Record) *list.Element {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = r
	return p.unacked.PushBack(r)
}

// ack drops e from the unacked records, marks the next offset to consume
// and frees e's window slot. After stop it marks nothing: the partition may
// belong to another member by then.
//
// The next offset to consume is the lowest unacked one, or the one after
// the latest forwarded record when every forwarded record is acked:
// everything below it is acked (the gaps in between hold no records this
// consumer was given, such as transaction markers). Only unacked records
// are kept, so the state stays within the window even while one message is
// retried for a long time.
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
// copy after each nack, and then cancels the message's context. Once the
// partition stopped it re-sends nothing and marks nothing, and only waits
// for the consumer to finish with the message (or for the subscription to
// end) before it cancels the context.
func (p *partition) watch(msg *message.Message, e *list.Element, ctx context.Context, cancel context.CancelFunc) {
	defer p.g.watchers.Done()
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
		// A Watermill message is acked or nacked once: send a new one
		// with the same UUID, payload and metadata.
		msg = msg.Copy()
		msg.SetContext(ctx)
		select {
		case p.g.out <- msg:
		case <-p.done:
			return
		}
	}
}

// stop ends the partition: no more forwarding, marks or re-sends. A paused
// partition is resumed, so that it is fetched again if it comes back.
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
