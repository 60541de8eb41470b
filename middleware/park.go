package middleware

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/config"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
	"github.com/claimtx/claimtx/store"
)

// Park is ordered effects' failure policy and release (Claim.OrderKey,
// docs/effects.md, "Ordered effects"). Its middleware, between Poison and
// Retry, parks a message with an order key that failed for good (what
// Poison would poison) in Postgres, in a transaction of its own, and lets
// the router ack it; the claim then parks every later message of that key
// behind it. Its Run releases parked keys: when an operator asks
// (`claimtx parked retry|skip`) or, with Retry, on a bounded backoff. A
// release runs the key's parked messages through the handler in their
// order, each under its claim in a transaction of its own, and stops at
// the first that fails again; a skip first sends the head to Poison with
// who asked and why.
//
// Build it with NewPark from the claim's configuration and the handler
// the claim wraps.
type Park struct {
	// Claim is the configuration given to NewClaim, OrderKey set; its
	// Store, Consumer, Key, KeyPolicy, OutboxTopic, Isolation,
	// SynchronousCommit, Logger and OnOutcome (called once per released
	// message) serve the release too. Required.
	Claim Claim
	// Handler is the handler the claim wraps (TxHandler's), which a
	// release runs. Required.
	Handler message.HandlerFunc
	// Poison receives a skipped head (NewPoison's middleware). Required.
	Poison message.HandlerMiddleware
	// Retry is the delay before a parked key's first automatic release;
	// each failed release doubles it, up to an hour. Defaults to 0: a key
	// is released only when an operator asks.
	Retry time.Duration
	// OnPark, when set, is called after msg was parked as its key's head,
	// with the error that parked it.
	OnPark func(msg *message.Message, err error)
}

// Parker is a validated Park.
type Parker struct {
	p Park
	c Claim // with defaults
}

// maxParkRetry bounds the automatic backoff.
const maxParkRetry = time.Hour

// releasePoll is how often Run looks for releases that are due: an
// operator's request waits at most that long.
const releasePoll = time.Second

// NewPark validates p and returns its Parker.
func NewPark(p Park) (*Parker, error) {
	switch {
	case p.Claim.OrderKey == nil:
		return nil, &framework.ConfigError{Field: "Claim.OrderKey", Reason: "must not be nil: parking is by order key"}
	case p.Claim.Mode == ModeNaturalKey:
		return nil, &framework.ConfigError{Field: "Claim.Mode", Reason: "ordered effects need the claim table (ModeNaturalKey's claim is the handler's own statement)"}
	case p.Handler == nil:
		return nil, &framework.ConfigError{Field: "Handler", Reason: "must not be nil"}
	case p.Poison == nil:
		return nil, &framework.ConfigError{Field: "Poison", Reason: "must not be nil: a skipped head goes to the poison destination"}
	case p.Retry < 0:
		return nil, &framework.ConfigError{Field: "Retry", Reason: "must not be negative"}
	}
	if err := p.Claim.validate(); err != nil {
		return nil, config.Rename(err, func(f string) (string, bool) { return "Claim." + f, true })
	}
	c := p.Claim
	c.CommittedKeys = -1 // the claim's own cache is the one that answers
	return &Parker{p: p, c: c.withDefaults()}, nil
}

// terminal reports whether err would make Poison poison msg, and msg
// parkable: not a poison memo's verdict nor an expired message, which say
// nothing about the key's order.
func terminal(msg *message.Message, err error) bool {
	switch {
	case err == nil || msg.Context().Err() != nil:
		return false
	case !framework.IsPermanent(err) && store.IsTransient(err):
		return false
	case poison.IsHit(err) || errors.As(err, new(*framework.ExpiredError)):
		return false
	}
	return true
}

// Middleware parks the messages with an order key that fail for good.
// Put it after Poison and before Retry.
func (pk *Parker) Middleware(h message.HandlerFunc) message.HandlerFunc {
	c := pk.c
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if !terminal(msg, err) {
			return out, err
		}
		orderKey, oerr := c.orderKey(msg)
		key, kerr := c.key(msg)
		if orderKey == "" || oerr != nil || kerr != nil || key == "" {
			return out, err // the poison policy's
		}
		// Detached, as Poison's dead-letter record: the message's work is
		// done, only its fate is left to write.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), poison.DeadLetterRecordTimeout)
		defer cancel()
		ok, perr := c.parking.ParkHead(ctx, parked(c.Consumer, msg, key, orderKey, err.Error()), pk.retryAt(1))
		if perr != nil {
			// Not parked: the message must come back, never be poisoned
			// while its key's later messages go on.
			return nil, &parkError{err: perr, cause: err}
		}
		if !ok {
			c.Logger.Debug("claimtx: a failed message's twin applied it; acked as a duplicate", watermill.LogFields{"consumer": c.Consumer, "message_uuid": msg.UUID})
			return nil, nil
		}
		c.Logger.Info("claimtx: message parked: its order key waits for a release", watermill.LogFields{"consumer": c.Consumer, "message_uuid": msg.UUID, "err": err.Error()})
		if pk.p.OnPark != nil {
			pk.p.OnPark(msg, err)
		}
		return nil, nil
	}
}

// parkError is a failure to park a message that failed with cause:
// Poison nacks it, whatever it was.
type parkError struct{ err, cause error }

func (e *parkError) Error() string {
	return fmt.Sprintf("%v (the message failed with: %v)", e.err, e.cause)
}
func (e *parkError) Unwrap() error { return e.err }

// retryAt is when the automatic release after failures failed ones is
// due; nil without Retry.
func (pk *Parker) retryAt(failures int) *time.Time {
	if pk.p.Retry <= 0 {
		return nil
	}
	d := pk.p.Retry << min(max(failures-1, 0), 20)
	if d <= 0 || d > maxParkRetry {
		d = maxParkRetry
	}
	t := time.Now().Add(d)
	return &t
}

// Run releases the parked keys of the consumer that are due, polling
// every second, until ctx ends.
func (pk *Parker) Run(ctx context.Context) error {
	t := time.NewTicker(releasePoll)
	defer t.Stop()
	for {
		pk.releaseDue(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// releaseDue releases the keys due now.
func (pk *Parker) releaseDue(ctx context.Context) {
	c := pk.c
	keys, err := c.parking.Due(ctx, c.Consumer, 64)
	if err != nil {
		if ctx.Err() == nil {
			c.Logger.Error("claimtx: reading the parked keys due for release failed", err, watermill.LogFields{"consumer": c.Consumer})
		}
		return
	}
	for _, k := range keys {
		if ctx.Err() != nil {
			return
		}
		pk.release(ctx, k)
	}
}

// release applies orderKey's parked messages in order, each in a
// transaction of its own that holds the key's row, until none is left (the
// key is released) or one fails again.
func (pk *Parker) release(ctx context.Context, orderKey string) {
	c := pk.c
	for ctx.Err() == nil {
		r, err := c.parking.BeginRelease(ctx, c.txOptions(), c.Consumer, orderKey)
		if err != nil || r == nil || r.Head == nil {
			if err != nil && ctx.Err() == nil {
				c.Logger.Error("claimtx: release of a parked key failed; it is tried again", err, watermill.LogFields{"consumer": c.Consumer})
			}
			if r != nil && err == nil {
				c.Logger.Info("claimtx: parked key released", watermill.LogFields{"consumer": c.Consumer})
			}
			return
		}
		if !pk.step(ctx, r) {
			return
		}
	}
}

// step applies, or skips, r's head and reports whether the release goes
// on. r.Tx is ended either way.
func (pk *Parker) step(ctx context.Context, r *pg.Release) bool {
	c := pk.c
	defer pg.Rollback(ctx, r.Tx) // a no-op once committed
	h := r.Head
	msg := message.NewMessage(h.UUID, h.Payload)
	if h.Metadata != nil {
		msg.Metadata = h.Metadata
	}
	msg.SetContext(ctx)
	start := time.Now()
	res := Result{Consumer: c.Consumer, Key: h.Key, Message: msg, Attempts: 1}
	if r.Key.SkipHead {
		skipped := framework.Permanent(&skippedError{By: r.Key.RequestedBy, Note: r.Key.RequestNote, Reason: h.Reason})
		if _, err := pk.p.Poison(func(*message.Message) ([]*message.Message, error) { return nil, skipped })(msg); err != nil {
			c.Logger.Error("claimtx: a skipped parked message could not be poisoned; the skip is tried again", err, watermill.LogFields{"consumer": c.Consumer, "message_uuid": h.UUID})
			return false
		}
		return pk.released(ctx, r, res, framework.Poisoned, start)
	}
	cr, err := c.Store.Claim(ctx, r.Tx, store.ClaimRequest{Consumer: c.Consumer, Key: h.Key, MaxClaimWait: c.MaxClaimWait})
	if err != nil {
		return pk.failed(ctx, r, err)
	}
	if !cr.New {
		return pk.released(ctx, r, res, framework.Duplicate, start)
	}
	produced, err := runHandler(msg, pk.p.Handler, r.Tx, h.Key)
	if err == nil && len(produced) > 0 {
		if c.OutboxTopic == "" {
			err = framework.Permanent(ErrProducedMessages)
		} else {
			err = c.enqueue(ctx, r.Tx, produced)
		}
	}
	if err != nil {
		return pk.failed(ctx, r, err)
	}
	res.Enqueued = len(produced)
	return pk.released(ctx, r, res, framework.Applied, start)
}

// released commits the end of r's head and reports it.
func (pk *Parker) released(ctx context.Context, r *pg.Release, res Result, out framework.Outcome, start time.Time) bool {
	c := pk.c
	if err := c.parking.Released(ctx, r); err != nil {
		if ctx.Err() == nil {
			c.Logger.Error("claimtx: release of a parked message failed to commit; it is tried again", err, watermill.LogFields{"consumer": c.Consumer})
		}
		return false
	}
	res.Outcome, res.Duration = out, time.Since(start)
	if c.OnOutcome != nil {
		c.OnOutcome(res)
	}
	return true
}

// failed ends a release whose head failed with err: the key stays parked.
// Interrupted or transient, nothing is recorded and the release is due
// again; else the failure is, with the next automatic release.
func (pk *Parker) failed(ctx context.Context, r *pg.Release, err error) bool {
	c := pk.c
	pg.Rollback(ctx, r.Tx)
	if ctx.Err() != nil {
		return false
	}
	if !framework.IsPermanent(err) && store.IsTransient(err) {
		c.Logger.Info("claimtx: release of a parked key met a transient failure; it is tried again", watermill.LogFields{"consumer": c.Consumer, "err": err.Error()})
		return false
	}
	if rerr := c.parking.ReleaseFailed(ctx, c.Consumer, r.Key.OrderKey, r.Head.Key, err.Error(), pk.retryAt(r.Key.Failures+1)); rerr != nil {
		c.Logger.Error("claimtx: recording a failed release failed", rerr, watermill.LogFields{"consumer": c.Consumer})
	}
	c.Logger.Info("claimtx: parked message failed again; its key stays parked", watermill.LogFields{"consumer": c.Consumer, "message_uuid": r.Head.UUID, "err": err.Error()})
	return false
}

// skippedError is the reason of a parked head an operator skipped
// (`claimtx parked skip`): it went to the poison destination.
type skippedError struct {
	By, Note string // who asked, and why
	Reason   string // why the head had failed
}

func (e *skippedError) Error() string {
	return fmt.Sprintf("claimtx: parked message skipped by %q (%s); it had failed with: %s", cmp.Or(e.By, "unknown"), cmp.Or(e.Note, "no reason given"), e.Reason)
}
