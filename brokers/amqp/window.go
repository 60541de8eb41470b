package amqp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/claimtx/claimtx/brokers/internal/wait"
)

// subscribeWindow is Subscribe in the window mode (Config.Window > 0): one
// amqp091 consumer on its own channel with QoS prefetch = Window. Unlike a
// watermill-amqp subscription it forwards the next delivery without waiting
// for the previous one's ack; each forwarded message is settled by a small
// goroutine of its own, on the channel its delivery came from.
//
// The first channel is opened here, so a queue that cannot be declared or
// consumed (PRECONDITION_FAILED, access refused) fails Subscribe as in the
// per-subscription mode; later channels are reopened with backoff.
func (s *Subscriber) subscribeWindow(ctx context.Context, topic string) (<-chan *message.Message, error) {
	w := &window{
		s:         s,
		topic:     topic,
		queue:     s.wc.Queue.GenerateName(topic),
		out:       make(chan *message.Message),
		logFields: watermill.LogFields{"topic": topic, "window": s.cfg.Window},
	}
	gen, err := w.open()
	if err != nil {
		return nil, fmt.Errorf("brokers/amqp: subscribe to %q (window %d): %w", topic, s.cfg.Window, err)
	}
	if !s.addForwarders(1) {
		_ = gen.ch.Close()
		return nil, errSubscriberClosed
	}
	// w.ctx ends with ctx or when the Subscriber closes, so everything
	// below watches one Done channel (waitConnected included).
	var cancel context.CancelFunc
	w.ctx, cancel = s.subscriptionContext(ctx)
	go func() {
		defer s.forwarders.Done()
		defer cancel()
		w.run(gen)
	}()
	return w.out, nil
}

// window is the state of one Subscribe call in the window mode.
type window struct {
	s         *Subscriber
	ctx       context.Context
	topic     string
	queue     string
	out       chan *message.Message
	logFields watermill.LogFields
}

// generation is one AMQP channel and its consumer. Delivery tags are per
// channel, and a delivery is only ever acked or nacked through its own
// Acknowledger, which is ch: a message from an older generation can never
// settle a delivery of a newer one.
type generation struct {
	ch         *amqp091.Channel
	acks       *acker
	deliveries <-chan amqp091.Delivery
	// ending is closed when the generation stops: each settle goroutine
	// then passes on an ack that already happened and returns.
	ending   chan struct{}
	settling sync.WaitGroup
}

// close ends the generation: acks given before it are sent, then the channel
// is closed, which makes RabbitMQ requeue every delivery still unacked
// (those not acked yet, and those whose nack delay is running). A later Ack
// or Nack of their messages has no effect; the redelivery is deduplicated
// by the claim.
func (g *generation) close() {
	close(g.ending)
	g.settling.Wait()
	g.acks.close()
	_ = g.ch.Close() // fails when the channel or connection is already gone
}

// open declares the queue, opens a channel with prefetch = Window and starts
// consuming.
func (w *window) open() (*generation, error) {
	// Declare the queue exactly as the per-subscription mode does, with
	// watermill-amqp's own topology builder and config (same name, durable
	// flag and QueueArguments), so both modes can share a queue.
	if err := w.s.sub.SubscribeInitialize(w.topic); err != nil {
		return nil, fmt.Errorf("declare queue %q: %w", w.queue, declareError(w.s.cfg, w.queue, err))
	}
	conn := w.s.conn.Connection()
	if conn == nil {
		return nil, errors.New("not connected to AMQP")
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(w.s.cfg.Window, 0, false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("set prefetch %d: %w", w.s.cfg.Window, err)
	}
	c := w.s.wc.Consume
	tag := w.s.cfg.ConnectionName + "-window-" + watermill.NewShortUUID()
	deliveries, err := ch.Consume(w.queue, tag, false, c.Exclusive, c.NoLocal, c.NoWait, c.Arguments)
	if err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("consume from %q: %w", w.queue, err)
	}
	w.s.logger.Info("Started window consumer", w.logFields.Add(watermill.LogFields{"consumer_tag": tag}))
	return &generation{ch: ch, acks: newAcker(ch), deliveries: deliveries, ending: make(chan struct{})}, nil
}

// run consumes until w.ctx ends, replacing the channel whenever it is lost,
// then closes out.
func (w *window) run(gen *generation) {
	defer close(w.out)
	for {
		stop := w.consume(gen)
		gen.close()
		if stop {
			return
		}
		w.s.logger.Info("AMQP channel of the window consumer closed, reopening", w.logFields)
		if gen = w.reopen(); gen == nil {
			return
		}
	}
}

// reopen waits for the connection and opens a new generation, retrying with
// backoff (ReconnectInitialInterval doubling to ReconnectMaxInterval). It
// returns nil when w.ctx ends first.
func (w *window) reopen() *generation {
	backoff := w.s.cfg.ReconnectInitialInterval
	for {
		err := waitConnected(w.ctx, w.s.cfg, w.s.conn)
		if err == nil {
			var gen *generation
			if gen, err = w.open(); err == nil {
				return gen
			}
		}
		if w.ctx.Err() != nil {
			return nil
		}
		w.s.logger.Error("Cannot resume the window consumer, retrying", err,
			w.logFields.Add(watermill.LogFields{"retry_in": backoff.String()}))
		if !wait.For(backoff, w.ctx.Done()) {
			return nil
		}
		backoff = min(2*backoff, w.s.cfg.ReconnectMaxInterval)
	}
}

// consume forwards gen's deliveries to out until the deliveries channel
// closes (channel or connection lost, consumer cancelled by RabbitMQ:
// returns false) or w.ctx ends (returns true). A delivery not handed over
// yet stays unacked and goes back with the channel.
func (w *window) consume(gen *generation) (stop bool) {
	for {
		var d amqp091.Delivery
		select {
		case <-w.ctx.Done():
			return true
		case dd, ok := <-gen.deliveries:
			if !ok {
				return false
			}
			d = dd
		}
		msg, err := marshaler{}.Unmarshal(d)
		if err != nil {
			// Unreachable with a real delivery (Unmarshal only refuses the
			// zero Delivery); nack rather than leave it unacked.
			w.s.logger.Error("Cannot unmarshal delivery, nacking it", err, w.logFields)
			_ = d.Nack(false, true)
			continue
		}
		// What watermill-amqp adds after Unmarshal in the per-subscription
		// mode, so both modes yield the same metadata.
		if d.Redelivered {
			msg.Metadata.Set(metadataRedelivered, "true")
		}
		// Like watermill-amqp: the message's context ends once it is
		// settled or the subscription ends.
		mctx, cancel := context.WithCancel(w.ctx)
		msg.SetContext(mctx)

		gen.acks.delivered(d.DeliveryTag)
		select {
		case w.out <- msg:
		case <-w.ctx.Done():
			cancel()
			return true
		}
		gen.settling.Add(1)
		go func() {
			defer gen.settling.Done()
			defer cancel()
			w.settle(gen, d, msg)
		}()
	}
}

// settle waits for msg's Ack or Nack and passes it on to d's channel: an
// ack through the generation's acker, which coalesces acks; a nack is held
// for NackDelay first (only this message's window slot stays taken
// meanwhile). Errors are ignored: they mean the channel is gone, and
// RabbitMQ redelivers whatever it had not been told (claims dedupe).
func (w *window) settle(gen *generation, d amqp091.Delivery, msg *message.Message) {
	select {
	case <-msg.Acked():
		gen.acks.ack(d.DeliveryTag)
	case <-msg.Nacked():
		if !wait.For(w.s.cfg.NackDelay, gen.ending) {
			return // closing the channel requeues it now
		}
		_ = d.Nack(false, true)
		gen.acks.settled(d.DeliveryTag)
	case <-gen.ending:
		// An ack given before the generation ended still counts, even when
		// this goroutine had not seen it yet (select picks at random).
		select {
		case <-msg.Acked():
			gen.acks.ack(d.DeliveryTag)
		default:
		}
	}
}
