package amqp

import (
	"sync"
	"time"
)

// ackHold bounds how long an ack behind a delivery in progress waits to go
// out in one frame with it.
const ackHold = 500 * time.Microsecond

type acknowledger interface {
	Ack(tag uint64, multiple bool) error
}

// Delivery states in the acker's window.
const (
	inProgress byte = iota // handed out, neither acked nor nacked
	acked                  // acked by the application, not sent yet
	done                   // settled with the broker (acked alone, nacked, or never handed out)
)

// acker coalesces the acks of one channel. Tags are consecutive, so it keeps
// the state of every tag from the lowest one not settled on. An ack that
// leaves the front acked goes out at once as one "multiple" ack up to the
// first tag in progress (never past it: a multiple ack covers every tag
// below); acks arriving while it is written join the next frame. An ack
// behind one in progress waits up to ackHold, then goes alone.
//
// One writer at a time sends the frames, in order: a multiple ack overtaken
// by a later one would name a tag the broker no longer has, and RabbitMQ
// closes the channel over it.
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

// delivered registers tag before its message is handed out. Tags come in
// increasing order; skipped tags count as done.
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

// settled records that the caller nacked tag itself.
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

// write sends frames until there is nothing to send, or leaves the work to
// the caller already writing. Called with a.mu held, it releases it.
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
			_ = a.ch.Ack(f.tag, f.multiple) // an error: the channel is gone, RabbitMQ redelivers
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

// takeLocked pops the settled front (one multiple ack) and, once the hold
// is over, the acked tags behind it (one ack each).
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

// close sends every ack recorded and stops: the channel is about to close.
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
