package amqp

import (
	"sync"
	"time"
)

// ackHold bounds how long an ack that is not at the front of the window
// (a delivery before it is still in progress) may wait for the deliveries
// before it, so that they all go out as one frame.
const ackHold = 500 * time.Microsecond

// acknowledger is the subset of *amqp091.Channel the acker uses.
type acknowledger interface {
	Ack(tag uint64, multiple bool) error
}

// Delivery states in the acker's window.
const (
	inProgress byte = iota // handed out, neither acked nor nacked
	acked                  // acked by the application, not sent yet
	done                   // settled with the broker (acked alone, nacked, or never handed out)
)

// acker coalesces the acks of one channel. Delivery tags on a channel are
// consecutive, so it keeps the state of every tag from the lowest one not
// settled with the broker on. An ack that leaves the front of that window
// acked goes out at once, as one AMQP "multiple" ack covering every acked
// tag up to the first one still in progress; acks that arrive while that
// frame is being written go out together in the next one, so a batch
// consumer acking a whole batch costs a few frames instead of one per
// message. A multiple ack covers every outstanding delivery up to its tag,
// so it never reaches past a delivery in progress. An ack behind one in
// progress waits up to ackHold for the front to catch up, then is sent
// alone, so no ack waits behind a slow or nacked message for long.
//
// One writer at a time sends the frames, in the order the window was
// popped: a multiple ack overtaken by a later one would name a tag the
// broker no longer has, which RabbitMQ answers by closing the channel.
type acker struct {
	ch acknowledger

	mu        sync.Mutex
	idle      sync.Cond // signalled when writing ends
	base      uint64    // tag of state[0]
	state     []byte    // state of tags base, base+1, …
	scheduled bool      // the hold timer is running
	holdDue   bool      // the hold is over: send acks behind the front alone
	writing   bool      // a caller is sending frames
	closed    bool
}

func newAcker(ch acknowledger) *acker {
	a := &acker{ch: ch}
	a.idle.L = &a.mu
	return a
}

// delivered registers tag before its message is handed out. Tags must come
// in increasing order; tags skipped (deliveries settled without being
// handed out) count as done.
func (a *acker) delivered(tag uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.state) == 0 {
		a.base = tag
	}
	for a.base+uint64(len(a.state)) < tag {
		a.state = append(a.state, done)
	}
	a.state = append(a.state, inProgress)
}

func (a *acker) set(tag uint64, s byte) bool {
	if tag < a.base || tag >= a.base+uint64(len(a.state)) {
		return false
	}
	a.state[tag-a.base] = s
	return true
}

// ack records the application's ack of tag and sends what it can.
func (a *acker) ack(tag uint64) {
	a.mu.Lock()
	if a.closed || !a.set(tag, acked) {
		a.mu.Unlock()
		return
	}
	if a.state[0] == inProgress && !a.scheduled {
		a.scheduled = true
		time.AfterFunc(ackHold, a.holdOver)
	}
	a.write()
}

// settled records that the caller nacked tag on the broker.
func (a *acker) settled(tag uint64) {
	a.mu.Lock()
	a.set(tag, done)
	a.write()
}

func (a *acker) holdOver() {
	a.mu.Lock()
	a.scheduled, a.holdDue = false, true
	a.write()
}

// write sends frames until there is nothing to send, with a.mu released
// while sending so that acks arriving meanwhile join the next frame. If
// another caller is writing, it leaves the work to that one. Called with
// a.mu held, it returns with a.mu released.
func (a *acker) write() {
	defer a.mu.Unlock()
	if a.writing {
		return
	}
	a.writing = true
	for !a.closed {
		frames := a.takeLocked()
		if len(frames) == 0 {
			break
		}
		a.mu.Unlock()
		for _, f := range frames {
			// An error means the channel is gone: RabbitMQ redelivers
			// what it was not told, and claims dedupe.
			_ = a.ch.Ack(f.tag, f.multiple)
		}
		a.mu.Lock()
	}
	a.writing = false
	a.idle.Broadcast()
}

type ackFrame struct {
	tag      uint64
	multiple bool
}

// takeLocked pops the settled front of the window (one multiple ack for
// its acked tags) and, once the hold is over, marks the acked tags behind
// the front as sent alone.
func (a *acker) takeLocked() []ackFrame {
	var frames []ackFrame
	var upTo uint64
	n := 0
	for n < len(a.state) && a.state[n] != inProgress {
		if a.state[n] == acked {
			upTo = a.base + uint64(n)
		}
		n++
	}
	a.state = a.state[n:]
	a.base += uint64(n)
	if len(a.state) == 0 {
		a.state = nil // let the array go
	}
	if upTo != 0 {
		frames = append(frames, ackFrame{tag: upTo, multiple: true})
	}
	if a.holdDue {
		a.holdDue = false
		for i, s := range a.state {
			if s == acked {
				frames = append(frames, ackFrame{tag: a.base + uint64(i)})
				a.state[i] = done
			}
		}
	}
	return frames
}

// close sends every ack recorded, waiting for a writer in progress, and
// stops: the channel is about to close, which requeues everything still
// outstanding.
func (a *acker) close() {
	a.mu.Lock()
	for a.writing {
		a.idle.Wait()
	}
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.holdDue = true
	frames := a.takeLocked()
	a.closed = true
	a.mu.Unlock()
	for _, f := range frames {
		_ = a.ch.Ack(f.tag, f.multiple)
	}
}
