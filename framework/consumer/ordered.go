package consumer

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/middleware"
)

const (
	// defaultParkedWarnAge is Config.ParkedWarnAge's default.
	defaultParkedWarnAge = time.Hour
	// parkedInterval is how often the parked keys are counted.
	parkedInterval = 10 * time.Second
)

// ordered reports whether c has an order key.
func (c Config) ordered() bool { return c.OrderKey != "" || c.Claim.OrderKey != nil }

// checkOrdered refuses an order key the broker would not keep in order:
// more than one message in flight lets a later message of a key apply
// before an earlier one, or beside it while it fails. In batch mode a
// window is what fills the batches, which one worker applies in turn: only
// parallel subscriptions are refused there (and more workers, by NewBatch).
func (c Config) checkOrdered(batch bool) error {
	if !c.ordered() {
		return nil
	}
	if c.Claim.Mode == middleware.ModeNaturalKey {
		return &framework.ConfigError{Field: "OrderKey", Reason: "not supported in ModeNaturalKey (see middleware.Claim.OrderKey)"}
	}
	one := func(field string, n int) error {
		if n > 1 {
			return &framework.ConfigError{Field: field, Reason: fmt.Sprintf("is %d, but ordered effects (OrderKey) need one message in flight: leave it unset or set it to 1", n)}
		}
		return nil
	}
	switch c.Broker.Kind {
	case "", brokers.KindAMQP:
		if batch && c.Broker.AMQP.Window > 0 {
			return nil // one consumer, in order
		}
		return cmp.Or(one("Broker.AMQP.Concurrency", c.Broker.AMQP.Concurrency), one("Broker.AMQP.Window", c.Broker.AMQP.Window))
	case brokers.KindKafka:
		if batch {
			return nil // a partition's records in order
		}
		return one("Broker.Kafka.Window", c.Broker.Kafka.Window)
	case brokers.KindNATS:
		return cmp.Or(one("Broker.NATS.Concurrency", c.Broker.NATS.Concurrency), one("Broker.NATS.MaxAckPending", c.Broker.NATS.MaxAckPending))
	}
	return nil
}

// newParker returns the middleware that parks failed messages of an order
// key, and keeps the Parker that releases them for Run; with no order key
// it passes messages through.
func (p *parts) newParker(claim middleware.Claim, handler message.HandlerFunc, l *ledger, poisonMW message.HandlerMiddleware) (message.HandlerMiddleware, error) {
	if claim.OrderKey == nil {
		return func(h message.HandlerFunc) message.HandlerFunc { return h }, nil
	}
	claim.OnOutcome = p.report // a released message is settled by its release
	// A skipped head is settled by its poisoned copy.
	skip := func(h message.HandlerFunc) message.HandlerFunc { return l.middleware(poisonMW(h)) }
	pk, err := middleware.NewPark(middleware.Park{Claim: claim, Handler: handler, Poison: skip, Retry: p.cfg.ParkRetry, OnPark: l.parked})
	if err != nil {
		return nil, claimFieldErr(err)
	}
	p.parker = pk
	return pk.Middleware, nil
}

// parkedWatch counts the consumer's parked keys for the metrics and warns
// in the readiness report when one is older than Config.ParkedWarnAge.
type parkedWatch struct {
	p *parts
	finding
}

func newParkedWatch(p *parts) *parkedWatch {
	if !p.cfg.ordered() {
		return nil
	}
	return &parkedWatch{p: p, finding: finding{name: "parked"}}
}

func (w *parkedWatch) watch(ctx context.Context) {
	w.check(ctx)
	every(ctx, parkedInterval, func() { w.check(ctx) })
}

func (w *parkedWatch) check(ctx context.Context) {
	cfg := w.p.cfg
	stats, err := pg.ParkingOf(w.p.store).Stats(ctx)
	if err != nil {
		if ctx.Err() == nil {
			cfg.Logger.Warn("claimtx: counting the parked keys failed", "consumer", cfg.Name, "err", err)
		}
		return
	}
	var s pg.ParkedStats
	for _, st := range stats {
		if st.Consumer == cfg.Name {
			s = st
		}
	}
	var age time.Duration
	if s.Keys > 0 {
		age = time.Since(s.Oldest)
	}
	if w.p.metrics != nil {
		w.p.metrics.SetParked(cfg.Name, s.Keys, s.Messages, age)
	}
	if s.Keys > 0 && age > cfg.ParkedWarnAge {
		w.set(fmt.Sprintf("%d order keys parked (%d messages), the oldest for %s, more than %s: fix the cause and release them (claimtx parked list --consumer %s)",
			s.Keys, s.Messages, age.Round(time.Second), cfg.ParkedWarnAge, cfg.Name))
		return
	}
	w.set("")
}

// checkParkedPrivileges refuses an order key to a role that could not park
// or release: every parked message deletes its new claim and writes the
// parked tables, every release deletes from them.
func (p *parts) checkParkedPrivileges(ctx context.Context) error {
	if !p.cfg.ordered() {
		return nil
	}
	n := p.names()
	all := []string{"SELECT", "INSERT", "UPDATE", "DELETE"}
	for _, t := range []struct {
		table string
		privs []string
	}{{n.ParkedKeys, all}, {n.Parked, all}, {n.Claims, []string{"DELETE"}}} {
		if err := p.requireClaimPrivileges(ctx, "OrderKey", t.table, "ordered effects use to park and release messages", "order key", t.privs...); err != nil {
			return err
		}
	}
	return nil
}
