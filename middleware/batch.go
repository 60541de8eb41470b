package middleware

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/store"
)

// Batch applies many messages in one claim transaction: one statement
// claims every key, the handler runs for the newly claimed messages in key
// order (a deterministic lock order, so concurrent batches do not deadlock
// on each other's effects), and one commit makes them all durable. Each
// message then gets its own result to ack or nack it.
//
// The guarantees are those of Claim, per message: a redelivered or
// concurrent twin is a duplicate, a failed message leaves neither claim nor
// effect, a crash between commit and ack turns the redelivery into a
// duplicate. A failing message does not sink its neighbours: each handler
// call runs under a savepoint; if any fails, the transaction is rolled back
// and redone without the failed messages (their claims would otherwise
// stay in the batch's transaction), so the others still commit.
//
// Batch reuses Claim's fields for the store, consumer, key, key policy,
// isolation, claim wait, attempts, backoff and hooks.
type Batch struct {
	Claim
}

// BatchHandlerFunc applies one message's effect through tx.
type BatchHandlerFunc func(ctx context.Context, tx pgx.Tx, msg *message.Message) error

// Process runs msgs through one claim transaction (retried whole on
// transient failures) and returns one error per message, in order: nil
// means applied or duplicate (ack), an error means nack, or poison when
// framework.IsPermanent.
func (b Batch) Process(ctx context.Context, msgs []*message.Message, h BatchHandlerFunc) []error {
	errs := make([]error, len(msgs))
	if err := b.Validate(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	c := b.withDefaults()
	start := time.Now()
	results := make([]Result, len(msgs))
	keys := make([]string, len(msgs))
	// leader[key] is the first message with that key; later ones in the
	// same batch share its fate as duplicates (or failures).
	leader := map[string]int{}
	for i, m := range msgs {
		results[i] = Result{Consumer: c.Consumer, Message: m}
		k, err := c.Key(m)
		if err == nil {
			k, err = c.KeyPolicy.Normalize(k)
		}
		if err != nil {
			errs[i] = framework.Permanent(err)
			continue
		}
		keys[i], results[i].Key = k, k
		if _, ok := leader[k]; !ok {
			leader[k] = i
		}
	}

	failed := map[int]error{} // handler failures, excluded from the next pass
	var claimed map[string]bool
	attempt, transient := 0, 0
	for {
		attempt++
		var err error
		claimed, err = c.batchAttempt(ctx, msgs, keys, leader, failed, h)
		if err == nil {
			break
		}
		if errRetryWithout == err { //nolint:errorlint // internal sentinel, never wrapped
			continue // new handler failures were recorded: redo without them
		}
		cause := store.Classify(err)
		transient++
		if !cause.Transient() || ctx.Err() != nil || transient >= c.MaxAttempts {
			for i := range msgs {
				if errs[i] == nil {
					errs[i] = fmt.Errorf("claimtx: batch of %d: %w", len(msgs), err)
				}
			}
			claimed = nil
			break
		}
		delay := c.backoff(transient)
		if c.OnRetry != nil {
			c.OnRetry(Retry{Consumer: c.Consumer, Attempt: transient, Cause: cause, Err: err, Delay: delay})
		}
		if sleep(ctx, delay) != nil {
			break
		}
	}

	for i := range msgs {
		r := &results[i]
		r.Attempts, r.Duration = attempt, time.Since(start)
		switch {
		case errs[i] != nil:
			r.Outcome, r.Err = framework.Failed, errs[i]
		case failed[leader[keys[i]]] != nil:
			errs[i] = failed[leader[keys[i]]]
			r.Outcome, r.Err = framework.Failed, errs[i]
		case claimed == nil:
			r.Outcome = framework.Failed
		case leader[keys[i]] == i && claimed[keys[i]]:
			r.Outcome = framework.Applied
		default:
			r.Outcome = framework.Duplicate
		}
		if c.OnOutcome != nil {
			c.OnOutcome(*r)
		}
	}
	return errs
}

// errRetryWithout asks Process for another pass without the messages whose
// handlers just failed.
var errRetryWithout = fmt.Errorf("claimtx: batch pass had handler failures")

func (c Claim) batchAttempt(ctx context.Context, msgs []*message.Message, keys []string, leader map[string]int, failed map[int]error, h BatchHandlerFunc) (map[string]bool, error) {
	var want []string
	for k, i := range leader {
		if failed[i] == nil {
			want = append(want, k)
		}
	}
	tx, err := c.Store.Pool().BeginTx(ctx, pgx.TxOptions{IsoLevel: c.Isolation})
	if err != nil {
		return nil, fmt.Errorf("claimtx: begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = tx.Rollback(rctx)
			cancel()
		}
	}()
	if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", fmt.Sprintf("%dms", max(1, c.ClaimWait.Milliseconds()))); err != nil {
		return nil, err
	}
	newKeys, err := c.Store.ClaimBatch(ctx, tx, c.Consumer, want)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout TO DEFAULT"); err != nil {
		return nil, err
	}
	claimed := make(map[string]bool, len(newKeys))
	newFailure := false
	// newKeys is sorted: effects are applied in key order.
	for _, k := range newKeys {
		claimed[k] = true
		i := leader[k]
		if _, err := tx.Exec(ctx, "SAVEPOINT claimtx_msg"); err != nil {
			return nil, err
		}
		if err := runBatchHandler(ctx, tx, msgs[i], h); err != nil {
			if store.Classify(err).Transient() {
				// Not this message's fault: a deadlock with another batch, a
				// serialization failure, a lost connection. Retry the whole
				// batch, this message included.
				return nil, err
			}
			if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT claimtx_msg"); rerr != nil {
				return nil, rerr
			}
			failed[i] = err
			newFailure = true
			continue
		}
		if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT claimtx_msg"); err != nil {
			return nil, err
		}
	}
	if newFailure {
		return nil, errRetryWithout
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("claimtx: commit: %w", err)
	}
	committed = true
	return claimed, nil
}

func runBatchHandler(ctx context.Context, tx pgx.Tx, msg *message.Message, h BatchHandlerFunc) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &framework.PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return h(framework.WithTx(ctx, tx), tx, msg)
}
