package middleware

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/kafkarecord"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
)

// Batch applies many messages in one claim transaction: one statement
// claims every key, the handler runs once for the newly claimed messages
// in key order (a deterministic lock order, so concurrent batches do not
// deadlock on each other's effects), and one commit makes them all
// durable. Each message then gets its own result to ack or nack it.
//
// The guarantees are those of Claim, per message, and a failing message
// does not sink its neighbours: the set is bisected under savepoints to
// find it, then committed without it (docs/batch.md).
//
// With Claim.OrderKey the handler gets the messages in delivery order
// instead, and the claim's round trip looks their order keys up: a new
// message of a parked key is parked behind it in the batch transaction
// (Outcome Parked, acked). A message that fails alone holds back every
// later message of its order key in the batch: they are left out of the
// commit and their result is a held error that shares its fate once it is
// settled (framework/consumer's NewBatch parks them behind it when it is
// parked, nacks them when it is nacked).
//
// Build it with NewBatch; framework/consumer's NewBatch runs one over a
// broker subscription.
type Batch struct {
	claim Claim // validated, with defaults
}

// NewBatch validates c for batches and returns the Batch. OnOutcome is
// called once per message and pass, OnRetry once per retried batch. Mode
// (natural key), OutboxTopic, Fingerprint and EventTime are refused with a
// *framework.ConfigError rather than ignored.
func NewBatch(c Claim) (*Batch, error) {
	const why = "not supported in batch mode"
	switch {
	case c.Mode != "" && c.Mode != ModeClaimTable:
		return nil, &framework.ConfigError{Field: "Mode", Reason: fmt.Sprintf("%q is %s (claim table only)", c.Mode, why)}
	case c.OutboxTopic != "":
		return nil, &framework.ConfigError{Field: "OutboxTopic", Reason: why + ": enqueue with Store.Enqueue in the handler"}
	case c.Fingerprint:
		return nil, &framework.ConfigError{Field: "Fingerprint", Reason: why}
	case c.EventTime != nil:
		return nil, &framework.ConfigError{Field: "EventTime", Reason: why + ": batches claim in a table not partitioned by event day"}
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Batch{claim: c.withDefaults()}, nil
}

// SetHandlerFunc applies the effects of msgs, the newly claimed messages
// in key order, set-wise through tx (one UPDATE … FROM unnest(…), say: a
// loop pays a round trip per statement per message). It must lock shared
// rows in a deterministic order, or concurrent batches deadlock and retry
// whole. An error fails the set, which Process then bisects.
//
// With Claim.OrderKey, msgs come in delivery order, not key order: the
// handler must apply them in the order given (one aggregate's events in
// turn, say by a WITH ORDINALITY column), and still lock shared rows in a
// deterministic order of its own (ORDER BY the row's key).
type SetHandlerFunc func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error

// Process runs msgs through one claim transaction and returns one error
// per message, in order: nil to ack, else nack, or poison when
// framework.IsPermanent. With Claim.OrderKey, a message held back behind
// an earlier failed one (see Batch) has a non-permanent error: nacked, it
// comes back after that one's fate.
func (b *Batch) Process(ctx context.Context, msgs []*message.Message, h SetHandlerFunc) []error {
	switch {
	case b == nil || b.claim.Store == nil:
		return slices.Repeat([]error{&framework.ConfigError{Field: "Batch", Reason: "build it with NewBatch"}}, len(msgs))
	case h == nil:
		return slices.Repeat([]error{&framework.ConfigError{Field: "handler", Reason: "must not be nil"}}, len(msgs))
	}
	return b.claim.processBatch(ctx, msgs, setWise(h))
}

var (
	// errRetryWithout asks for another pass without the messages whose
	// handlers just failed.
	errRetryWithout = errors.New("claimtx: batch pass had handler failures")
	// errIsolate asks for another pass that isolates failures.
	errIsolate = errors.New("claimtx: batch failed, isolating the failing messages")
)

func (c Claim) processBatch(ctx context.Context, msgs []*message.Message, a setWise) []error {
	errs := make([]error, len(msgs))
	start := time.Now()
	keys := make([]string, len(msgs))
	orderKeys := make([]string, len(msgs)) // "" without one
	unordered := make([]bool, len(msgs))
	cached := make([]bool, len(msgs)) // a duplicate settled by the committed-key cache
	// leader[key] is the first message with that key; later ones share its
	// fate as duplicates (or failures).
	leader := make(map[string]int, len(msgs))
	for i, m := range msgs {
		k, err := c.key(m)
		if err != nil {
			errs[i] = framework.Permanent(err)
			continue
		}
		keys[i] = k
		m.SetContext(pg.WithKey(m.Context(), k)) // for framework.ClaimKey in the set handler
		if c.cached(ctx, c.cache.Key(c.Consumer, 0, k)) {
			cached[i] = true
			continue
		}
		if _, ok := leader[k]; !ok {
			leader[k] = i
			var look pg.Lookups
			look, unordered[i] = c.lookups(m)
			orderKeys[i] = look.OrderKey
		}
	}

	failed := map[int]error{} // handler failures, excluded from the next pass
	// settling is the Kafka positions a commit settles: every message's
	// but those that fail (nacked, or poisoned and acked later).
	settling := func() []kafkarecord.Settled {
		if c.positions == nil {
			return nil
		}
		var s kafkarecord.Settling
		for i, m := range msgs {
			if errs[i] != nil || (!cached[i] && failed[leader[keys[i]]] != nil) {
				continue
			}
			if r, ok := kafkarecord.FromContext(m.Context()); ok {
				s.Add(r)
			}
		}
		return s.Positions()
	}
	var claimed, parked map[string]bool
	attempt, transient, isolating := 0, 0, false
	for len(leader) > 0 {
		attempt++
		var err error
		claimed, parked, err = c.batchAttempt(ctx, msgs, leader, orderKeys, failed, a, isolating, settling)
		if err == nil {
			break
		}
		if errors.Is(err, errRetryWithout) || errors.Is(err, errIsolate) {
			// After a fast pass (the only one to return errIsolate),
			// isolate the rest; after an isolating pass, the survivors are
			// known to succeed.
			isolating = !isolating
			continue
		}
		cause := pg.Classify(err)
		transient++
		if cause.Transient() && ctx.Err() == nil && transient < c.MaxAttempts {
			serr := c.pause(ctx, transient, cause, err)
			if serr == nil {
				continue
			}
			err = fmt.Errorf("retry abandoned: %w", serr)
		}
		// Nothing committed: every message fails (nack or poison).
		for i := range msgs {
			if errs[i] == nil {
				errs[i] = fmt.Errorf("claimtx: batch of %d: %w", len(msgs), err)
			}
		}
		break
	}

	for i, m := range msgs {
		r := Result{Consumer: c.Consumer, Message: m, Key: keys[i], Attempts: attempt, Duration: time.Since(start), Unordered: unordered[i]}
		switch {
		case cached[i]:
			r.Outcome, r.Attempts = framework.Duplicate, 0
		case errs[i] != nil:
			r.Outcome, r.Err = framework.Failed, errs[i]
		case failed[leader[keys[i]]] != nil:
			errs[i] = failed[leader[keys[i]]]
			r.Outcome, r.Err = framework.Failed, errs[i]
		case parked[keys[i]]:
			r.Outcome = framework.Parked
		case leader[keys[i]] == i && claimed[keys[i]]:
			r.Outcome = framework.Applied
		default:
			r.Outcome = framework.Duplicate
		}
		if c.OnOutcome != nil {
			c.OnOutcome(r)
		}
	}
	return errs
}

// batchAttempt runs one pass: the claim transaction of the leaders not
// failed yet. It returns the keys it applied and those it parked behind
// their order keys.
func (c Claim) batchAttempt(ctx context.Context, msgs []*message.Message, leader map[string]int, orderKeys []string, failed map[int]error, a setWise, isolating bool, settling func() []kafkarecord.Settled) (claimed, parkedKeys map[string]bool, err error) {
	want := make([]string, 0, len(leader))
	var ordered []string // the order keys to look up
	for k, i := range leader {
		if failed[i] == nil {
			want = append(want, k)
			if orderKeys[i] != "" {
				ordered = append(ordered, orderKeys[i])
			}
		}
	}
	began := c.ahead.Started()
	tx, newKeys, memos, parkedOrder, err := c.claims.BeginBatch(ctx, c.txOptions(), c.Consumer, want, c.MaxClaimWait, c.PoisonMemo, ordered)
	if err != nil {
		return nil, nil, err
	}
	// Memoised keys were dead-lettered before: they are poisoned without
	// reaching the handler, and later passes leave them out.
	for k, reason := range memos {
		failed[leader[k]] = framework.Permanent(&poison.HitError{Reason: reason})
	}
	defer pg.Rollback(ctx, tx) // a no-op once committed
	claimed = make(map[string]bool, len(newKeys))
	parkedKeys = map[string]bool{}
	idx := make([]int, 0, len(newKeys)) // newKeys is sorted: effects run in key order
	behind := map[int]string{}          // new claims of parked order keys: message -> key
	for _, k := range newKeys {
		i := leader[k]
		if orderKeys[i] != "" && parkedOrder[orderKeys[i]] {
			parkedKeys[k], behind[i] = true, k
			continue
		}
		claimed[k] = true
		idx = append(idx, i)
	}
	if c.OrderKey != nil {
		// Effects in delivery order: one order key's messages apply in turn.
		slices.Sort(idx)
	}
	if len(idx) > 0 {
		before := len(failed)
		if err := a.apply(ctx, tx, msgs, idx, failed, isolating); err != nil {
			return nil, nil, err
		}
		if len(failed) > before {
			if c.OrderKey != nil {
				holdBehind(idx, orderKeys, failed)
			}
			return nil, nil, errRetryWithout
		}
	}
	if len(behind) > 0 {
		// Parked in delivery order, their claims undone: one more round
		// trip, only when something is parked.
		ms := make([]pg.ParkedMessage, 0, len(behind))
		for _, i := range slices.Sorted(maps.Keys(behind)) {
			ms = append(ms, parked(c.Consumer, msgs[i], behind[i], orderKeys[i], ""))
		}
		if err := c.parking.ParkBehind(ctx, tx, ms...); err != nil {
			return nil, nil, err
		}
	}
	// Last before COMMIT: one statement, rows locked in partition order.
	if c.positions != nil {
		if err := c.positions.Store(ctx, tx, c.Consumer, settling()); err != nil {
			return nil, nil, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, fmt.Errorf("claimtx: commit: %w", err)
	}
	// Every key of want but the memoised and the parked ones (whose claims
	// were undone) is now known committed (see Claim.attempt).
	var dups []string
	for _, k := range want {
		if _, memoised := memos[k]; !memoised && !parkedKeys[k] {
			c.cache.Add(c.cache.Key(c.Consumer, 0, k))
			if c.ahead != nil && !claimed[k] {
				dups = append(dups, k)
			}
		}
	}
	c.ahead.Answered(ctx, began, dups, len(claimed) > 0)
	return claimed, parkedKeys, nil
}

// holdBehind records as held, in failed, every message of idx (in
// delivery order) after the first that failed of its order key: they
// depend on it, and must not commit without it.
func holdBehind(idx []int, orderKeys []string, failed map[int]error) {
	head := map[string]int{} // order key -> its first failed message
	for _, i := range idx {
		k := orderKeys[i]
		if k == "" {
			continue
		}
		if h, ok := head[k]; ok {
			failed[i] = &pg.HeldError{Head: h, Err: failed[h]}
		} else if failed[i] != nil {
			head[k] = i
		}
	}
}

type setWise SetHandlerFunc

// apply applies the effects of the messages at idx (in key order) and
// records in failed each that fails alone. Not isolating, it runs without
// savepoints and returns errIsolate when a failure is not a single
// message's; isolating, it bisects under savepoints down to single
// messages, leaving the others applied. A transient failure is returned,
// for the whole batch to retry.
func (h setWise) apply(ctx context.Context, tx pgx.Tx, msgs []*message.Message, idx []int, failed map[int]error, isolating bool) error {
	set := make([]*message.Message, len(idx))
	for j, i := range idx {
		set[j] = msgs[i]
	}
	call := func() error { return guard(func() error { return h(pg.WithTx(ctx, tx), tx, set) }) }
	var err error
	if isolating {
		err = underSavepoint(ctx, tx, call)
	} else {
		err = call()
	}
	switch {
	case err == nil:
		return nil
	case pg.Classify(err).Transient():
		return err
	case len(idx) == 1:
		failed[idx[0]] = err
		return nil
	case !isolating:
		return errIsolate
	}
	mid := len(idx) / 2
	if err := h.apply(ctx, tx, msgs, idx[:mid], failed, true); err != nil {
		return err
	}
	return h.apply(ctx, tx, msgs, idx[mid:], failed, true)
}

// underSavepoint runs f under a savepoint, rolled back to when f fails so
// the transaction goes on without f's writes. A transient failure is
// returned as is, for the whole batch to retry.
func underSavepoint(ctx context.Context, tx pgx.Tx, f func() error) error {
	if _, err := tx.Exec(ctx, "SAVEPOINT claimtx_batch"); err != nil {
		return err
	}
	if err := f(); err != nil {
		if pg.Classify(err).Transient() {
			return err
		}
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT claimtx_batch; RELEASE SAVEPOINT claimtx_batch"); rerr != nil {
			return rerr
		}
		return err
	}
	_, err := tx.Exec(ctx, "RELEASE SAVEPOINT claimtx_batch")
	return err
}

// guard turns a handler panic into a *framework.PanicError, so deferred
// rollbacks run and the caller sees an ordinary failure.
func guard(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &framework.PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return f()
}
