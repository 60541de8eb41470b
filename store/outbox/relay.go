package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store"
	"github.com/claimtx/claimtx/store/internal/outboxsql"
)

// Defaults for Config fields left zero, stated in the fields' docs.
const (
	defaultBatchSize       = 100
	defaultPollInterval    = time.Second
	defaultInitialBackoff  = 100 * time.Millisecond
	defaultMaxBackoff      = 10 * time.Second
	defaultRetention       = 24 * time.Hour
	defaultCleanupInterval = time.Minute
	defaultPublishTimeout  = 30 * time.Second

	// cleanupBatch sent rows per cleanup statement, cleanupPause apart: a
	// trickle of short locks and WAL bursts that still keeps up.
	cleanupBatch = 10_000
	cleanupPause = 10 * time.Millisecond
	// markTimeout bounds marking published rows once the relay's context
	// is cancelled: one UPDATE and COMMIT, not a hung shutdown.
	markTimeout = 5 * time.Second
)

// ErrPublishTimeout is the failure recorded on rows whose Publish call did
// not return within Config.PublishTimeout.
var ErrPublishTimeout = errors.New("claimtx relay: publish timed out")

// Config tunes a Relay. The zero value is usable.
type Config struct {
	// BatchSize is how many rows one relay transaction locks, publishes
	// and marks: larger means fewer round trips, longer-held row locks and
	// more resends after a crash. Defaults to 100.
	BatchSize int
	// PollInterval is how often an idle relay looks for rows anyway,
	// besides waking on Enqueue's notifications. Defaults to 1s.
	PollInterval time.Duration
	// DisableListen turns LISTEN/NOTIFY off: the relay only polls, and
	// holds no dedicated connection outside the pool. Defaults to false.
	DisableListen bool
	// InitialBackoff is the wait after a failed batch; it doubles on each
	// consecutive failure up to MaxBackoff, with jitter. Defaults to 100ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the wait between failed batches. Defaults to 10s.
	MaxBackoff time.Duration
	// Retention is how long sent rows are kept (audits, manual replays);
	// deduplication does not depend on it. Defaults to 24h.
	Retention time.Duration
	// CleanupInterval is how often Run calls Cleanup; negative disables it
	// in this relay. Defaults to 1m.
	CleanupInterval time.Duration
	// PublishTimeout bounds one Publish call, which takes no context: a
	// broker that never confirms would hold the batch's row locks forever.
	// The rows stay pending with ErrPublishTimeout recorded (the abandoned
	// call may still complete: one more resend). Negative disables the
	// bound. Defaults to 30s.
	PublishTimeout time.Duration
	// OnBatch, when set, is called on the relay goroutine after every
	// batch transaction: keep it fast.
	OnBatch func(Batch)
	// Logger receives failures and cleanup results. Defaults to no logging.
	Logger watermill.LoggerAdapter
}

// Batch describes one relay transaction.
type Batch struct {
	Locked int // pending rows this relay's transaction locked
	// Published rows were accepted by the publisher and, unless Err is a
	// marking failure, marked sent.
	Published int
	// Err ended the batch, if any; rows not marked stay pending.
	Err      error
	Duration time.Duration
}

func (c Config) withDefaults() Config {
	c.BatchSize = cmp.Or(c.BatchSize, defaultBatchSize)
	c.PollInterval = cmp.Or(c.PollInterval, defaultPollInterval)
	c.InitialBackoff = cmp.Or(c.InitialBackoff, defaultInitialBackoff)
	c.MaxBackoff = max(cmp.Or(c.MaxBackoff, defaultMaxBackoff), c.InitialBackoff)
	c.Retention = cmp.Or(c.Retention, defaultRetention)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, defaultCleanupInterval)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, defaultPublishTimeout)
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	return c
}

// Relay publishes the outbox of one Store through a Watermill publisher.
// Any number of relays, in any processes, share the backlog.
type Relay struct {
	st           *store.Store
	outbox       *outboxsql.Statements
	pub          message.Publisher
	cfg          Config
	cleanupBatch int // cleanupBatch; tests make it smaller
}

// New validates its arguments and returns a Relay; nothing is touched
// until Run. The publisher should return from Publish only once the broker
// has taken responsibility for the messages (brokers' publishers do):
// with a fire-and-forget one, rows are marked sent for messages the broker
// may still lose.
func New(st *store.Store, pub message.Publisher, cfg Config) (*Relay, error) {
	for _, f := range []struct {
		name    string
		invalid bool
		reason  string
	}{
		{"Store", st == nil, "must not be nil"}, {"Publisher", pub == nil, "must not be nil"},
		{"BatchSize", cfg.BatchSize < 0, "must not be negative"}, {"PollInterval", cfg.PollInterval < 0, "must not be negative"},
		{"InitialBackoff", cfg.InitialBackoff < 0, "must not be negative"}, {"MaxBackoff", cfg.MaxBackoff < 0, "must not be negative"},
		{"Retention", cfg.Retention < 0, "must not be negative"},
	} {
		if f.invalid {
			return nil, &framework.ConfigError{Field: f.name, Reason: f.reason}
		}
	}
	sc := st.Config()
	return &Relay{
		st:           st,
		outbox:       outboxsql.For(sc.Schema, sc.OutboxTable),
		pub:          pub,
		cfg:          cfg.withDefaults(),
		cleanupBatch: cleanupBatch,
	}, nil
}

// Run relays until ctx is cancelled, then returns nil after the batch in
// flight ended. Failures are retried with backoff, never returned. With
// LISTEN on, behind a transaction pooler (where notifications are lost) it
// returns a *framework.ConfigError for DisableListen wrapping
// store.ErrTransactionPooler.
func (r *Relay) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	if !r.cfg.DisableListen {
		pooled := r.behindPooler(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if pooled {
			return &framework.ConfigError{Field: "DisableListen", Err: store.ErrTransactionPooler,
				Reason: "is false, but LISTEN's notifications are lost behind a transaction pooler: " +
					"set DisableListen (the relay polls every PollInterval), or give the relay a Store whose pool connects to PostgreSQL directly"}
		}
		wg.Go(func() { r.listen(ctx, wake) })
	}

	failures := 0
	var nextCleanup time.Time
	for {
		if ctx.Err() != nil {
			return nil
		}
		if r.cfg.CleanupInterval > 0 && !time.Now().Before(nextCleanup) {
			if _, err := r.Cleanup(ctx); err != nil && ctx.Err() == nil {
				r.cfg.Logger.Error("claimtx relay: cleanup of sent outbox rows failed", err, nil)
			}
			nextCleanup = time.Now().Add(r.cfg.CleanupInterval)
		}
		b := r.relayBatch(ctx)
		if b.Err != nil {
			if ctx.Err() != nil {
				return nil
			}
			failures++
			delay := r.backoff(failures)
			r.cfg.Logger.Error("claimtx relay: batch failed, rows stay pending", b.Err, watermill.LogFields{
				"locked": b.Locked, "published": b.Published, "failures": failures, "retry_in": delay})
			if err := pg.Sleep(ctx, delay); err != nil {
				return nil
			}
			continue
		}
		failures = 0
		if b.Locked == r.cfg.BatchSize {
			continue // more may be waiting
		}
		if !r.idle(ctx, wake) {
			return nil
		}
	}
}

// idle waits for a notification or the next poll; false when ctx ended.
func (r *Relay) idle(ctx context.Context, wake <-chan struct{}) bool {
	poll := time.NewTimer(r.cfg.PollInterval)
	defer poll.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-wake:
	case <-poll.C:
	}
	return true
}

// relayBatch runs one relay transaction: lock up to BatchSize pending
// rows, publish them in id order, consecutive rows of one topic in one
// Publish call, mark the published rows sent, commit. On a publish error
// it marks what was published before and records the failure on the rows
// of the failed call: they and everything after stay pending, in order.
// Once ctx is cancelled no further Publish is started.
func (r *Relay) relayBatch(ctx context.Context) Batch {
	start, b := time.Now(), Batch{}
	b.Err = r.publishBatch(ctx, &b)
	b.Duration = time.Since(start)
	if r.cfg.OnBatch != nil {
		r.cfg.OnBatch(b)
	}
	return b
}

func (r *Relay) publishBatch(ctx context.Context, b *Batch) (err error) {
	tx, err := r.st.Pool().Begin(ctx)
	if err != nil {
		return fmt.Errorf("claimtx relay: begin: %w", err)
	}
	defer pg.Rollback(ctx, tx) // a no-op once committed
	rows, err := r.outbox.LockPending(ctx, tx, r.cfg.BatchSize)
	if err != nil {
		return err
	}
	b.Locked = len(rows)
	if len(rows) == 0 {
		return nil // the deferred rollback ends the read-only transaction
	}

	var publishErr error
	var failed []int64
	for i := 0; i < len(rows); {
		if ctx.Err() != nil {
			publishErr = ctx.Err()
			break
		}
		j := i + 1
		for j < len(rows) && rows[j].Topic == rows[i].Topic {
			j++
		}
		msgs := make([]*message.Message, 0, j-i)
		for _, row := range rows[i:j] {
			msgs = append(msgs, row.Message())
		}
		if err := r.publish(rows[i].Topic, msgs); err != nil {
			publishErr = fmt.Errorf("claimtx relay: publish %d message(s) to %q: %w", j-i, rows[i].Topic, err)
			failed = ids(rows[i:j])
			break
		}
		b.Published = j
		i = j
	}

	// What was published is marked even when ctx was cancelled meanwhile:
	// a graceful stop must not cause resends.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	if err := r.outbox.MarkSent(mctx, tx, ids(rows[:b.Published])); err != nil {
		return errors.Join(publishErr, err)
	}
	if err := r.outbox.MarkFailed(mctx, tx, failed, publishErr); err != nil {
		return errors.Join(publishErr, err)
	}
	if err := tx.Commit(mctx); err != nil {
		return errors.Join(publishErr, fmt.Errorf("claimtx relay: commit: %w", err))
	}
	return publishErr
}

// publish calls Publish, bounded by PublishTimeout. A call that times out
// is left to finish on its own goroutine.
func (r *Relay) publish(topic string, msgs []*message.Message) error {
	if r.cfg.PublishTimeout < 0 {
		return r.pub.Publish(topic, msgs...)
	}
	done := make(chan error, 1)
	go func() { done <- r.pub.Publish(topic, msgs...) }()
	t := time.NewTimer(r.cfg.PublishTimeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("%w after %s", ErrPublishTimeout, r.cfg.PublishTimeout)
	}
}

// Cleanup deletes sent rows older than Retention, in statements of 10,000
// rows until none are left (skipping rows another relay's cleanup holds),
// and returns how many it deleted.
func (r *Relay) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for {
		n, err := r.outbox.DeleteSent(ctx, r.st.Pool(), r.cfg.Retention, r.cleanupBatch)
		total += n
		if err != nil {
			return total, err
		}
		if n < int64(r.cleanupBatch) {
			if total > 0 {
				r.cfg.Logger.Info("claimtx relay: deleted sent outbox rows", watermill.LogFields{"rows": total, "retention": r.cfg.Retention})
			}
			return total, nil
		}
		if err := pg.Sleep(ctx, cleanupPause); err != nil {
			return total, err
		}
	}
}

// behindPooler asks BehindTransactionPooler, retrying with the batches'
// backoff while the database does not answer (false when ctx ends first).
func (r *Relay) behindPooler(ctx context.Context) bool {
	for failures := 1; ; failures++ {
		pooled, err := r.st.BehindTransactionPooler(ctx)
		if err == nil || ctx.Err() != nil {
			return pooled
		}
		r.cfg.Logger.Error("claimtx relay: cannot tell whether the database is behind a transaction pooler (needed for LISTEN); retrying", err, nil)
		if pg.Sleep(ctx, r.backoff(failures)) != nil {
			return false
		}
	}
}

// listen keeps a LISTEN connection open and signals wake for every
// notification about this relay's outbox, reconnecting after PollInterval.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	for ctx.Err() == nil {
		err := r.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Info("claimtx relay: LISTEN connection lost, polling until it is back", watermill.LogFields{"err": err.Error()})
		if pg.Sleep(ctx, r.cfg.PollInterval) != nil {
			return
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context, wake chan<- struct{}) error {
	conn, err := pgx.ConnectConfig(ctx, r.st.Pool().Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("claimtx relay: listen: connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = conn.Close(cctx)
		cancel()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{pg.OutboxChannel}.Sanitize()); err != nil {
		return fmt.Errorf("claimtx relay: listen: %w", err)
	}
	// Rows committed while no connection listened were not announced.
	signal(wake)
	cfg := r.st.Config()
	want := pg.OutboxPayload(cfg.Schema, cfg.OutboxTable)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("claimtx relay: wait for notification: %w", err)
		}
		if n.Payload == want {
			signal(wake)
		}
	}
}

func signal(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default: // a wake-up is already pending
	}
}

func ids(rows []outboxsql.Row) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

func (r *Relay) backoff(failures int) time.Duration {
	d := r.cfg.InitialBackoff
	for i := 1; i < failures && d < r.cfg.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, r.cfg.MaxBackoff)
	// Half jitter: relays failing together (the broker went down) spread
	// out, and the wait never collapses to nothing.
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}
