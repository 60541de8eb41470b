package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Shutdown bounds: with the default drain within Kubernetes' 30 s grace.
const (
	defaultDrainTimeout = 15 * time.Second
	// abortGrace bounds the wait for cancelled work: a handler that
	// ignores its context cannot be stopped, and shutdown must still end.
	abortGrace         = 5 * time.Second
	startWaitMax       = 5 * time.Second // a shutdown's wait for the router to start (see consume)
	routerCloseTimeout = 5 * time.Second // the wait for the subscriptions to end after the drain
)

// errShuttingDown is returned for a message that arrived during shutdown,
// to nack it; it wraps context.Canceled, which Watermill does not log at
// ERROR.
var errShuttingDown = fmt.Errorf("claimtx: consumer shutting down, message handed back to the broker: %w", context.Canceled)

// drainer is the shutdown of both modes (docs/reliability.md): no new
// work starts, and work in flight at the drain timeout is cancelled, which
// Poison and the batch settler take for an interruption.
type drainer struct {
	mu       sync.Mutex
	stopping bool
	inflight int
	idle     chan struct{} // closed when stopping with nothing in flight

	abortCtx context.Context // cancelled when the drain timeout passes
	abort    context.CancelFunc
	released chan struct{} // closed when held arrivals may return
	relOnce  sync.Once
	logger   *slog.Logger // says, at DEBUG, what was handed back
}

func newDrainer(logger *slog.Logger) *drainer {
	d := &drainer{idle: make(chan struct{}), released: make(chan struct{}), logger: logger}
	d.abortCtx, d.abort = context.WithCancel(context.Background())
	return d
}

// enter admits work, or reports false once shutdown began.
func (d *drainer) enter() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping {
		return false
	}
	d.inflight++
	return true
}

func (d *drainer) leave() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.inflight--
	if d.stopping && d.inflight == 0 {
		close(d.idle)
	}
}

// context returns ctx, cancelled at the drain timeout too.
func (d *drainer) context(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(d.abortCtx, cancel)
	return ctx, func() { stop(); cancel() }
}

func (d *drainer) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if !d.enter() {
			// Held until the subscriptions end: a nack now would requeue
			// it to this still-subscribed consumer, in a loop.
			<-d.released
			d.logger.Debug("claimtx: message arrived during shutdown, handed back to the broker unprocessed", "message_uuid", msg.UUID)
			return nil, errShuttingDown
		}
		defer d.leave()
		orig := msg.Context()
		ctx, cancel := d.context(orig)
		msg.SetContext(ctx)
		defer func() {
			cancel()
			msg.SetContext(orig)
		}()
		return h(msg)
	}
}

// drain stops admitting work and waits for the work in flight: timeout,
// then abortGrace after cancelling it.
func (d *drainer) drain(timeout time.Duration, logger *slog.Logger) {
	d.mu.Lock()
	if !d.stopping {
		d.stopping = true
		if d.inflight == 0 {
			close(d.idle)
		}
	}
	n := d.inflight
	d.mu.Unlock()
	if n > 0 {
		logger.Info("claimtx: draining in-flight messages", "in_flight", n, "drain_timeout", timeout)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-d.idle:
		return
	case <-t.C:
	}
	d.mu.Lock()
	n = d.inflight
	d.mu.Unlock()
	logger.Warn("claimtx: drain timeout passed, cancelling in-flight messages (they roll back and go back to the broker)", "in_flight", n, "drain_timeout", timeout)
	d.abort()
	t.Reset(abortGrace)
	select {
	case <-d.idle:
	case <-t.C:
		logger.Error("claimtx: in-flight messages ignored cancellation; shutting down without them (they were not acked and will be redelivered)", "grace", abortGrace)
	}
}

// release lets held-back arrivals return, to be nacked.
func (d *drainer) release() {
	d.relOnce.Do(func() { close(d.released) })
}
