package consumer

import (
	"errors"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/middleware"
)

// ledger reports one outcome per delivery, when it is acked or nacked. The
// claim reports every pass, and retries pass a delivery through it again:
// dashboards divide by claimtx_messages_total as a count of messages, so
// the ledger keeps the last pass and counts the others as handler retries.
type ledger struct {
	consumer string
	report   func(middleware.Result) // metrics, Config.OnOutcome
	retried  func()                  // told of every pass after a delivery's first

	mu   sync.Mutex
	open map[*message.Message]*entry
}

// entry is one delivery in flight (retries reuse the *message.Message).
type entry struct {
	last    middleware.Result // the claim's latest pass
	passes  int
	verdict framework.Outcome // Poisoned or Expired once a copy was published, Parked once parked
	reason  error
}

func (l *ledger) entry(msg *message.Message) *entry {
	e := l.open[msg]
	if e == nil {
		e = &entry{}
		l.open[msg] = e
	}
	return e
}

// claimed records one pass of the claim; use it as the claim's OnOutcome.
func (l *ledger) claimed(r middleware.Result) {
	if r.Message == nil {
		return
	}
	l.mu.Lock()
	e := l.entry(r.Message)
	e.last = r
	e.passes++
	again := e.passes > 1
	l.mu.Unlock()
	if again && l.retried != nil {
		l.retried()
	}
}

// poisoned records msg's dead-lettered copy and returns the key of its
// last pass, for the poison memo.
func (l *ledger) poisoned(msg *message.Message, err error) (key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entry(msg)
	e.verdict, e.reason = framework.Poisoned, err
	if errors.As(err, new(*framework.ExpiredError)) {
		e.verdict = framework.Expired
	}
	return e.last.Key
}

// parked records that msg was parked as its order key's head.
func (l *ledger) parked(msg *message.Message, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entry(msg)
	e.verdict, e.reason = framework.Parked, err
}

// settle reports msg's one outcome: err is nil when it is acked.
func (l *ledger) settle(msg *message.Message, err error) {
	l.mu.Lock()
	e := l.open[msg]
	delete(l.open, msg)
	l.mu.Unlock()
	r := middleware.Result{Consumer: l.consumer, Message: msg}
	if e != nil && e.passes > 0 {
		r = e.last // key, attempts and timings of the last pass
	}
	switch {
	case err != nil:
		r.Outcome, r.Err = framework.Failed, err
	case e != nil && e.verdict != "":
		r.Outcome, r.Err = e.verdict, e.reason
	case e != nil && e.passes > 0 && r.Err == nil:
		// Applied or Duplicate, as the claim reported it.
	default:
		// Neither a commit nor a poisoned copy: any outcome would be a guess.
		return
	}
	l.report(r)
}

// middleware settles each delivery; outside Poison, it sees what the
// router acks or nacks.
func (l *ledger) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		l.settle(msg, err)
		return out, err
	}
}

// newLedger returns p's ledger; handler is the Watermill handler name ("" in
// batch mode), for the metrics' series to exist from the start.
func (p *parts) newLedger(handler string) *ledger {
	var retried func()
	if p.metrics != nil {
		p.metrics.InitConsumer(p.cfg.Name, handler)
		retried = func() { p.metrics.OnHandlerRetry(p.cfg.Name) }
	}
	return &ledger{consumer: p.cfg.Name, report: p.report, retried: retried, open: map[*message.Message]*entry{}}
}
