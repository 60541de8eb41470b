package amqp

import (
	"sync"
	"time"
)

// ackFlushDelay is how long an ack may wait to be coalesced with others.
// A batch consumer acks a whole batch at once; sending those acks as one
// frame with AMQP's "multiple" flag spares RabbitMQ and this process a
// frame and a socket write per message.
const ackFlushDelay = time.Millisecond

// acknowledger is the subset of *amqp091.Channel the acker uses.
type acknowledger interface {
	Ack(tag uint64, multiple bool) error
}

// acker coalesces the acks of one channel. It tracks the deliveries that
// are still outstanding at the broker (bounded by the prefetch window) and
// which of them the application has acked. A flush acks, with one
// multiple ack, every acked tag below the lowest tag that is not acked —
// a multiple ack covers every outstanding delivery up to its tag, so it
// must never reach past one that is still being processed or waiting for
// its nack — and acks the others one by one. Nothing waits longer than
// ackFlushDelay: an ack stuck behind a slow message is sent alone.
type acker struct {
	ch acknowledger

	mu          sync.Mutex
	outstanding map[uint64]bool // delivered, not settled with the broker; true once acked
	scheduled   bool
	closed      bool
}

func newAcker(ch acknowledger) *acker {
	return &acker{ch: ch, outstanding: map[uint64]bool{}}
}

// delivered registers tag before its message is handed out.
func (a *acker) delivered(tag uint64) {
	a.mu.Lock()
	a.outstanding[tag] = false
	a.mu.Unlock()
}

// ack records the application's ack of tag; it reaches the broker within
// ackFlushDelay.
func (a *acker) ack(tag uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	a.outstanding[tag] = true
	if !a.scheduled {
		a.scheduled = true
		time.AfterFunc(ackFlushDelay, a.flush)
	}
}

// settled forgets tag, nacked on the broker by the caller.
func (a *acker) settled(tag uint64) {
	a.mu.Lock()
	delete(a.outstanding, tag)
	a.mu.Unlock()
}

func (a *acker) flush() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.scheduled = false
	if !a.closed {
		a.flushLocked()
	}
}

// close sends the acks given so far and stops: the channel is about to
// close, which requeues everything still outstanding.
func (a *acker) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.closed {
		a.flushLocked()
		a.closed = true
	}
}

func (a *acker) flushLocked() {
	const none = ^uint64(0)
	low := none // the lowest outstanding tag not acked yet
	for tag, acked := range a.outstanding {
		if !acked && tag < low {
			low = tag
		}
	}
	var upTo uint64
	for tag, acked := range a.outstanding {
		if !acked {
			continue
		}
		if tag < low {
			upTo = max(upTo, tag)
			continue
		}
		// Behind a delivery still in progress: alone, now.
		_ = a.ch.Ack(tag, false) // an error means the channel is gone: RabbitMQ redelivers, claims dedupe
		delete(a.outstanding, tag)
	}
	if upTo == 0 {
		return
	}
	_ = a.ch.Ack(upTo, true)
	for tag := range a.outstanding {
		if tag <= upTo {
			delete(a.outstanding, tag)
		}
	}
}
