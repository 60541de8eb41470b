package consumer

import (
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
)

// keyHold keeps a RabbitMQ batch consumer's order keys in order across a
// nack. The broker puts a nacked message back at its place in the queue,
// but the window that fills the batches already holds later messages of
// its key, which would apply before it comes back: those are nacked too,
// and each key then runs its messages only in the order they were first
// nacked, until all of them are back. One batch worker uses it.
type keyHold struct {
	key, orderKey framework.KeyFunc
	logger        *slog.Logger
	now           func() time.Time
	held          map[string]*heldKey // by order key
}

// heldKey is an order key's nacked messages, by dedup key, in the order
// they must run.
type heldKey struct {
	keys  []string
	since time.Time // when the first was nacked
	// ran is how many messages of the current batch nacked joined keys at
	// its front: they ran before every message still waited for, in turn.
	ran int
}

// maxHold bounds how long a key waits for its nacked messages: one that
// does not come back (dead-lettered by the broker's delivery limit, taken
// by another consumer) must not hold its key's later messages forever.
const maxHold = time.Minute

// errHeldBack is the result of a message nacked behind its key's.
var errHeldBack = errors.New("claimtx: nacked behind an earlier message of its order key, which the broker redelivers first")

func newKeyHold(key, orderKey framework.KeyFunc, logger *slog.Logger) *keyHold {
	return &keyHold{key: key, orderKey: orderKey, logger: logger, now: time.Now, held: map[string]*heldKey{}}
}

// admit returns the messages of batch that may run, in order, and hands
// the others to back: a message of a held key runs when it is the next
// its key waits for; another joins the end of the wait.
func (h *keyHold) admit(batch []*message.Message, back func(*message.Message)) []*message.Message {
	h.expire()
	for _, w := range h.held {
		w.ran = 0
	}
	if len(h.held) == 0 {
		return batch
	}
	run := batch[:0:0]
	for _, m := range batch {
		k, err := h.orderKey(m)
		w := h.held[k]
		if err != nil || w == nil {
			run = append(run, m)
			continue
		}
		key, err := h.key(m)
		switch {
		case err != nil:
			run = append(run, m)
		case key == w.keys[0]:
			if w.keys = w.keys[1:]; len(w.keys) == 0 {
				delete(h.held, k)
			}
			run = append(run, m)
		default:
			if !slices.Contains(w.keys, key) {
				w.keys = append(w.keys, key)
			}
			back(m)
		}
	}
	return run
}

// expire lets go of the keys that waited longer than maxHold, whether or
// not a later message of theirs came, so that none is held for good.
func (h *keyHold) expire() {
	for k, w := range h.held {
		if h.now().Sub(w.since) > maxHold {
			delete(h.held, k)
			h.logger.Warn("claimtx: nacked messages of an order key did not come back; its later messages go on without them", "waited", maxHold, "missing", len(w.keys))
		}
	}
}

// nacked makes m's order key wait for m: a message that ran and failed
// comes before every message its key still waits for, after those of its
// batch nacked before it.
func (h *keyHold) nacked(m *message.Message) {
	k, err := h.orderKey(m)
	if err != nil {
		return
	}
	key, err := h.key(m)
	if err != nil {
		return
	}
	w := h.held[k]
	switch {
	case w == nil:
		h.held[k] = &heldKey{keys: []string{key}, since: h.now(), ran: 1}
	case !slices.Contains(w.keys, key):
		w.keys = slices.Insert(w.keys, w.ran, key)
		w.ran++
	}
}
