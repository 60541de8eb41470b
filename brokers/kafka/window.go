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
)

// Window mode (Config.Window > 0).
//
// watermill-kafka forwards one message per partition and waits for its ack
// before it reads the next, so a consumer holds at most as many unacked
// messages as it owns partitions, and a batch consumer (consumer.NewBatch)
// cannot form larger batches. In window mode Subscribe runs its own Sarama
// consumer group with the same Sarama configuration and marshaler, and a
// handler that forwards up to Window messages per partition before any is
// acked:
//
//   - Each claimed partition gets a semaphore of Window slots. A slot is taken
//     before a record is read from the claim and given back when its message
//     (or the last copy of it, after nacks) is acked.
//   - Forwarded offsets that are not acked yet are kept in order. An ack of
//     the lowest one marks the next lowest (or the one after the latest
//     forwarded record), so the committed offset never passes an unacked
//     message; Sarama's auto-commit writes marked offsets every
//     Config.CommitInterval and when the session ends.
//   - A nack re-sends a fresh copy (Watermill messages can be acked only once)
//     after Config.NackDelay; its slot stays taken, later messages go on.
//   - When the session ends (rebalance, ctx end, Close), ConsumeClaim stops
//     forwarding and returns at once without waiting for the outstanding acks:
//     they belong to a session that is over, are never marked (on it or on a
//     later one, whose partitions may have moved to another member), and their
//     messages are delivered again from the committed offset, where the claim
//     table turns them into duplicates. Messages not yet handed out, and
//     pending nack re-sends, are dropped the same way.
//   - Each message has its own context, derived from the subscription's
//     (Subscribe's ctx, ended by Close too) and cancelled once the message is
//     acked, as watermill-kafka does (Watermill's conformance suite checks
//     it); a nacked message's copies share it. A session ending does not
//     cancel it: work in progress on a message of an ended session may still
//     finish (its redelivery is then a duplicate) rather than be thrown away.
//
// saramaConfig keeps Sarama's default eager (range) rebalance protocol, under
// which every rebalance ends the session and cancels its context: that is the
// signal the handler stops on.

// subscribeWindow is Subscribe in window mode.
func (s *Subscriber) subscribeWindow(ctx context.Context, topic string) (<-chan *message.Message, error) {
	what := fmt.Sprintf("subscribe to %q", topic)
	var group sarama.ConsumerGroup
	err := retryStart(ctx, s.cfg, s.logger, what, func() error {
		if s.closed.Load() {
			return errPermanent{errSubscriberClosed}
		}
		var err error
		group, err = sarama.NewConsumerGroup(s.cfg.Brokers, s.cfg.ConsumerGroup, s.sc)
		return err
	})
	if err != nil {
		return nil, err
	}

	// Close sets closed under mu before it waits, so no subscription is
	// added once Close is waiting.
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		_ = group.Close()
		return nil, fmt.Errorf("brokers/kafka: %s: %w", what, errSubscriberClosed)
	}
	s.windowWG.Add(1)
	s.mu.Unlock()

	fields := watermill.LogFields{
		"provider":       "kafka",
		"topic":          topic,
		"consumer_group": s.cfg.ConsumerGroup,
		"window":         s.cfg.Window,
	}
	s.logger.Info("Subscribing to Kafka topic (window mode)", fields)

	// runCtx ends with ctx or Close; every message's context derives from
	// it, as in watermill-kafka.
	runCtx, cancel := context.WithCancel(ctx)
	// Unbuffered, as watermill-kafka's: nothing is read ahead of the
	// consumer beyond what the window allows.
	out := make(chan *message.Message)
	var watchers sync.WaitGroup
	h := &windowHandler{
		out:       out,
		runCtx:    runCtx,
		watchers:  &watchers,
		window:    s.cfg.Window,
		nackDelay: s.cfg.NackDelay,
		logger:    s.logger,
		fields:    fields,
	}

	var helpers sync.WaitGroup
	helpers.Go(func() {
		select {
		case <-s.closing:
			cancel()
		case <-runCtx.Done():
		}
	})
	// Consumer.Return.Errors is on (saramaConfig): read and log them, as
	// watermill-kafka does, until the subscription ends; group.Close
	// drains what is left.
	helpers.Go(func() {
		for {
			select {
			case err, ok := <-group.Errors():
				if !ok {
					return
				}
				if err != nil {
					s.logger.Error("Sarama internal error", err, fields)
				}
			case <-runCtx.Done():
				return
			}
		}
	})

	go func() {
		defer s.windowWG.Done()
		s.consumeWindow(runCtx, group, topic, h, fields)
		cancel()
		helpers.Wait()
		// Consume has returned, and with it every ConsumeClaim: no new
		// watchers start, and the ones left see their claim done and
		// runCtx cancelled and return. Then nothing sends on out any more.
		watchers.Wait()
		// Leave the group.
		if err := group.Close(); err != nil {
			s.logger.Info("Group close with error", fields.Add(watermill.LogFields{"err": err.Error()}))
		}
		close(out)
		s.logger.Info("Consuming done (window mode)", fields)
	}()
	return out, nil
}

// consumeWindow runs group sessions until ctx ends. Consume returns at every
// rebalance (eager protocol) and is called again; after an error it is
// retried every Config.ReconnectBackoff, as watermill-kafka re-creates a
// failed consumer.
func (s *Subscriber) consumeWindow(ctx context.Context, group sarama.ConsumerGroup, topic string, h *windowHandler, fields watermill.LogFields) {
	for ctx.Err() == nil {
		err := group.Consume(ctx, []string{topic}, h)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			s.logger.Debug("Session ended (rebalance), consuming again", fields)
			continue
		}
		if errors.Is(err, sarama.ErrClosedConsumerGroup) {
			return
		}
		s.logger.Error("Group consume error, retrying", err, fields.Add(watermill.LogFields{"retry_in": s.cfg.ReconnectBackoff.String()}))
		t := time.NewTimer(s.cfg.ReconnectBackoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// windowHandler is the sarama.ConsumerGroupHandler of one window-mode
// subscription. Sarama calls ConsumeClaim concurrently, once per claimed
// partition; all state is per call.
type windowHandler struct {
	out       chan<- *message.Message
	runCtx    context.Context // parent of every message's context
	watchers  *sync.WaitGroup // watch goroutines of all claims
	window    int
	nackDelay time.Duration
	logger    watermill.LoggerAdapter
	fields    watermill.LogFields
}

var _ sarama.ConsumerGroupHandler = (*windowHandler)(nil)

func (*windowHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (*windowHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

// ConsumeClaim forwards the claim's records until the session ends or the
// claim's channel closes, then returns without waiting for outstanding acks.
func (h *windowHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	p := &windowPartition{
		h:         h,
		sess:      sess,
		topic:     claim.Topic(),
		partition: claim.Partition(),
		slots:     make(chan struct{}, h.window),
		done:      make(chan struct{}),
	}
	fields := h.fields.Add(watermill.LogFields{
		"kafka_partition":      claim.Partition(),
		"kafka_initial_offset": claim.InitialOffset(),
	})
	h.logger.Debug("Claim started (window mode)", fields)
	defer func() {
		p.stop()
		h.logger.Debug("Claim stopped (window mode)", fields)
	}()

	// The session context ends on a rebalance, on ctx end or Close (it is
	// derived from the context given to Consume) and when Sarama closes
	// the group.
	sessDone := sess.Context().Done()
	for {
		select {
		case p.slots <- struct{}{}:
		case <-sessDone:
			return nil
		}
		var rec *sarama.ConsumerMessage
		select {
		case r, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			rec = r
		case <-sessDone:
			return nil
		}
		msg, err := marshaler{}.Unmarshal(rec)
		if err != nil {
			// Cannot happen (Unmarshal never fails); ends the session
			// like watermill-kafka would.
			return fmt.Errorf("brokers/kafka: unmarshal %s/%d@%d: %w", rec.Topic, rec.Partition, rec.Offset, err)
		}
		ctx, cancel := context.WithCancel(h.runCtx)
		msg.SetContext(ctx)
		e := p.track(rec.Offset)
		select {
		case h.out <- msg:
		case <-sessDone:
			cancel()
			return nil
		}
		h.watchers.Add(1)
		go p.watch(msg, e, ctx, cancel)
	}
}

// windowPartition is the state of one ConsumeClaim call.
type windowPartition struct {
	h         *windowHandler
	sess      sarama.ConsumerGroupSession
	topic     string
	partition int32
	slots     chan struct{} // window semaphore: one token per unacked message
	done      chan struct{} // closed when ConsumeClaim returns

	mu      sync.Mutex
	stopped bool      // no more marking: the claim is over
	unacked list.List // offsets (int64) forwarded and not acked yet, ascending
	last    int64     // offset of the latest record forwarded
}

// track records a forwarded offset. Records arrive in offset order.
func (p *windowPartition) track(offset int64) *list.Element {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = offset
	return p.unacked.PushBack(offset)
}

// ack drops e from the unacked offsets, marks the next offset to consume and
// frees e's window slot. After stop it does nothing: the session that could
// commit the mark is over.
//
// The next offset to consume is the lowest unacked one, or the one after the
// latest forwarded record when every forwarded record is acked: everything
// below it is acked (the gaps in between hold no records this consumer was
// given, such as transaction markers). Only unacked offsets are kept, so the
// state stays within Window entries even while one message is retried for a
// long time.
func (p *windowPartition) ack(e *list.Element) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	wasFirst := p.unacked.Front() == e
	p.unacked.Remove(e)
	if wasFirst {
		next := p.last + 1
		if f := p.unacked.Front(); f != nil {
			next = f.Value.(int64)
		}
		// Still inside ConsumeClaim (stopped is false), so this is the
		// session that owns the partition; Sarama commits it.
		p.sess.MarkOffset(p.topic, p.partition, next, "")
	}
	<-p.slots // e holds a slot, so this never blocks
}

// watch follows one forwarded message until it is acked, re-sending a fresh
// copy after each nack, and then cancels the message's context. Once the
// claim is over it re-sends nothing and marks nothing, and only waits for the
// consumer to finish with the message (or for the subscription to end)
// before it cancels the context.
func (p *windowPartition) watch(msg *message.Message, e *list.Element, ctx context.Context, cancel context.CancelFunc) {
	defer p.h.watchers.Done()
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
		if d := p.h.nackDelay; d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-p.done:
				t.Stop()
				return
			}
		}
		// A Watermill message is acked or nacked once: send a new one
		// with the same UUID, payload and metadata.
		msg = msg.Copy()
		msg.SetContext(ctx)
		select {
		case p.h.out <- msg:
		case <-p.done:
			return
		}
	}
}

// stop ends the claim: no more marks and no more re-sends. It does not wait
// for the watch goroutines: they never mark once stopped is set, and the
// subscription waits for them before it closes its channel.
func (p *windowPartition) stop() {
	p.mu.Lock()
	p.stopped = true
	p.unacked.Init()
	p.mu.Unlock()
	close(p.done)
}
