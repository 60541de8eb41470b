package middleware

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/committedkeys"
	"github.com/claimtx/claimtx/internal/kafkarecord"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
)

// Group commit (docs/design.md, "Group commit"): the messages waiting for
// the claim go through one transaction, each in a step of its own under a
// savepoint. A step that fails is rolled back to its savepoint alone. One
// that meets another group's lock ends its group and leads the next; one
// that cannot tell its fate otherwise (a second such wait, a lost
// connection) runs in a transaction of its own, the per-message path with
// its retries and backoff.
const (
	// maxMaxGroup keeps a group's subtransactions within the 64 a server
	// process tracks before each snapshot has to look them up on disk.
	maxMaxGroup = 64
	// groupLockWait bounds the lock waits of every step but a group's
	// first: a later step already holds the earlier ones' locks, so a long
	// wait there is how two groups deadlock (found only after the server's
	// deadlock_timeout, 1 s by default) and how a twin's group stalls ours.
	groupLockWait = 10 * time.Millisecond
)

// grouping reports whether c commits in groups.
func (c Claim) grouping() bool { return pg.Grouping(c.MaxGroup, c.Isolation) }

// grouper runs the group transactions of one wrapped handler.
type grouper struct {
	c     Claim
	h     message.HandlerFunc
	conns int // the pool's size: at most that many groups run at once

	mu     sync.Mutex
	queue  []*member
	active int // groups running
	// Contention (a step that met another group's lock) shrinks what runs
	// at once, in one of two ways. On rows every group writes, groups of
	// one side by side are fastest, as one transaction per message would
	// be: groups of two measured about half their rate. But a handler
	// whose transactions lock rows in message-dependent order deadlocks
	// even as groups of one, each deadlock waiting for the server's detector
	// (deadlock_timeout, 1 s); there few full groups in turn are fastest,
	// as a later step's lock wait is bounded. So the size shrinks first,
	// and once a group of one met a deadlock, the number of groups does.
	//
	// size is how many messages a group may take, at most MaxGroup:
	// halved on contention, raised by one after wait clean groups.
	size  int
	clean int // groups without contention since size or limit last changed
	// wait doubles on contention (up to maxGrowWait groups per
	// connection) and halves (down to one per connection) when a size of
	// two or more stayed clean that long: where every group contends the
	// probes of a larger size grow rare, and a load that stops contending
	// grows back within a few thousand groups.
	wait int
	// serial is set once a group of one met a deadlock: from then on limit
	// adapts, and groups keep MaxGroup.
	serial bool
	// limit is how many groups may run, at most conns: with serial,
	// halved on contention, raised by one after a round of clean groups.
	limit int
}

// maxGrowWait bounds grouper.wait, in groups per connection.
const maxGrowWait = 64

// member is one message waiting for, or in, a group.
type member struct {
	msg  *message.Message
	ctx  context.Context // msg's, read once: the group sets msg's for the handler
	req  pg.ClaimRequest
	look pg.Lookups
	hash committedkeys.Hash
	res  *Result // written by the group until done closes

	taken    bool // by a group (under grouper.mu)
	requeued bool // stepped aside once already
	found    bool // the handler found its effect present: no claim to cache
	done     chan struct{}
	state    memberState
	out      framework.Outcome // when state is settling or committed
	// err is the result when state is failed; when alone, the transient
	// failure (or end of context) of m's own step, if that is why.
	err error
}

type memberState int

const (
	pending   memberState = iota
	settling              // Applied or Duplicate once the group commits
	committed             // out is its result
	failed                // rolled back to its savepoint; err is its result
	alone                 // left to a transaction of its own
	aside                 // met another group's lock: goes first in the next group
)

func newGrouper(c Claim, h message.HandlerFunc) *grouper {
	conns := max(1, int(c.Store.Pool().Config().MaxConns))
	return &grouper{c: c, h: h, conns: conns, size: c.MaxGroup, wait: conns, limit: conns}
}

// do puts m in a group and returns once its state is known. A message
// whose context ends while it waits is left alone, to fail as the
// per-message path does.
func (g *grouper) do(m *member) {
	m.done, m.ctx = make(chan struct{}), m.msg.Context()
	g.mu.Lock()
	g.queue = append(g.queue, m)
	// Up to limit groups, at most one per connection: an idle consumer's
	// message starts at once, and messages wait only while every group
	// that may run does.
	if g.active < g.limit {
		g.active++
		go g.run()
	}
	g.mu.Unlock()
	select {
	case <-m.done:
		return
	case <-m.ctx.Done():
	}
	g.mu.Lock()
	if !m.taken {
		if i := slices.Index(g.queue, m); i >= 0 {
			g.queue = slices.Delete(g.queue, i, i+1)
		}
		m.state = alone
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	<-m.done
}

// run commits groups while messages wait.
func (g *grouper) run() {
	for {
		g.mu.Lock()
		if len(g.queue) == 0 || g.active > g.limit {
			g.active--
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		g.group()
	}
}

// settle adapts the group size or the number of groups to how the last
// group went: contended when a step met another group's lock, deadlocked
// when its only step, alone, did.
func (g *grouper) settle(contended, deadlocked bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if deadlocked && !g.serial {
		g.serial, g.size, g.clean = true, g.c.MaxGroup, 0
	}
	contended = contended || deadlocked
	switch {
	case g.serial && contended:
		g.limit, g.clean = max(1, g.limit/2), 0
	case g.serial:
		if g.limit < g.conns {
			// One more after a round of clean groups.
			if g.clean++; g.clean >= 4*g.limit {
				g.limit, g.clean = g.limit+1, 0
			}
		}
	case contended:
		g.size, g.clean = max(1, g.size/2), 0
		g.wait = min(2*g.wait, maxGrowWait*g.conns)
	case g.size < g.c.MaxGroup:
		if g.clean++; g.clean >= g.wait {
			if g.size > 1 {
				// A group of one cannot meet contention: only a larger
				// size that stayed clean tells the rows are no longer hot.
				g.wait = max(g.conns, g.wait/2)
			}
			g.size, g.clean = g.size+1, 0
		}
	}
}

// requeue puts m back at the head of the queue.
func (g *grouper) requeue(m *member) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m.taken, m.requeued, m.state = false, true, pending
	g.queue = slices.Insert(g.queue, 0, m)
}

// take is the next waiting message, or nil.
func (g *grouper) take() *member {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) == 0 {
		return nil
	}
	m := g.queue[0]
	g.queue = g.queue[1:]
	m.taken = true
	return m
}

// group runs one group transaction: steps while messages wait, up to
// MaxGroup and MaxGroupTime, then one COMMIT.
func (g *grouper) group() {
	c := g.c
	// The group's statements end when any member's context does: its
	// handler's would break the connection anyway.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var members []*member
	contended, deadlocked := false, false
	defer func() {
		g.settle(contended, deadlocked)
		for _, m := range members {
			if m.state == pending || m.state == settling {
				m.state = alone
			}
			close(m.done)
		}
	}()
	var tx pgx.Tx
	defer func() {
		if tx != nil {
			pg.Rollback(ctx, tx) // a no-op once committed
		}
	}()
	began := c.ahead.Started()
	start := time.Now()
	lockSet := false
	g.mu.Lock()
	size := g.size
	g.mu.Unlock()
	for len(members) < size && (len(members) == 0 || time.Since(start) < c.MaxGroupTime) {
		m := g.take()
		if m == nil {
			break
		}
		members = append(members, m)
		defer context.AfterFunc(m.ctx, cancel)()
		first := tx == nil
		if !g.step(ctx, &tx, m, &lockSet) {
			return // the transaction is lost: the others go alone too
		}
		// A transaction of one message's locks deadlocked.
		deadlocked = deadlocked || first && m.state == alone && pg.Classify(m.err) == pg.Deadlock
		if m.state == aside {
			// Commit, releasing what m may wait for, and let m lead the
			// next group, where it waits as long as a message alone.
			members, contended = members[:len(members)-1], true
			g.requeue(m)
			break
		}
		contended = contended || m.state == alone && m != members[0]
	}
	if tx == nil {
		return // nothing to commit: every step failed
	}
	if c.positions != nil {
		var s kafkarecord.Settling
		for _, m := range members {
			if r, ok := kafkarecord.FromContext(m.ctx); ok && m.state == settling {
				s.Add(r)
			}
		}
		if ps := s.Positions(); len(ps) > 0 {
			b := &pgx.Batch{}
			// Other groups hold these rows to their commits: wait for them.
			if lockSet {
				b.Queue("SET LOCAL lock_timeout TO DEFAULT")
			}
			c.positions.Queue(b, c.Consumer, ps...)
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		// Ambiguous: alone, each retry meets its claim if it committed.
		return
	}
	var dups []string
	claimed := false
	for _, m := range members {
		if m.state != settling {
			continue
		}
		m.state = committed
		if m.found {
			continue
		}
		c.cache.Add(m.hash)
		if m.out == framework.Applied {
			claimed = true
		} else if m.req.Key != "" {
			dups = append(dups, m.req.Key)
			c.Logger.Debug("claimtx: duplicate delivery acked without running the handler", watermill.LogFields{"consumer": c.Consumer, "message_uuid": m.msg.UUID})
		}
	}
	c.ahead.Answered(ctx, began, dups, claimed)
}

// step runs m's claim and handler in tx and reports whether the
// transaction can go on. The group's first step begins tx as the
// per-message path does, without a savepoint: a group of one is that
// path's transaction, and when it fails the whole transaction goes and the
// next step begins another. Later steps each run under a savepoint; the
// first of them sets groupLockWait, before its savepoint so that it stays.
func (g *grouper) step(ctx context.Context, tx *pgx.Tx, m *member, lockSet *bool) bool {
	c := g.c
	first := *tx == nil
	req := m.req
	req.PayloadHash = c.payloadHash(m.msg)
	var cr pg.ClaimResult
	var found pg.Found
	var err error
	claimStart := time.Now()
	switch {
	case first && c.Mode == ModeNaturalKey:
		*tx, err = c.claims.BeginNaturalKey(ctx, c.txOptions(), c.MaxClaimWait, nil)
		*lockSet = false
	case first:
		*tx, cr, found, err = c.claims.Begin(ctx, c.txOptions(), req, m.look, nil)
		*lockSet = false
	default:
		wait := groupLockWait
		if *lockSet {
			wait = 0
		}
		var r *pg.ClaimRequest
		if c.Mode != ModeNaturalKey {
			r = &req
		}
		cr, found, err = c.claims.Step(ctx, *tx, r, m.look, wait)
		*lockSet = *lockSet || err == nil
	}
	m.res.ClaimWait = time.Since(claimStart)
	if err != nil {
		return g.undo(ctx, tx, first, m, err)
	}
	if cr.New && found.Memo != nil {
		// Dead-lettered before: undo the claim, poison this copy too.
		return g.undo(ctx, tx, first, m, framework.Permanent(&poison.HitError{Reason: *found.Memo}))
	}
	if cr.New && found.Parked {
		// Parked behind its key, settled (acked, its position stored) with
		// the group's commit.
		if err := c.parkBehind(ctx, *tx, m.msg, m.req.Key, m.look.OrderKey); err != nil {
			return g.undo(ctx, tx, first, m, err)
		}
		m.state, m.out, m.found = settling, framework.Parked, true
		return true
	}
	m.res.FingerprintMismatch = cr.FingerprintMismatch
	if cr.FingerprintMismatch {
		c.Logger.Error("claimtx: duplicate key with a different payload: a producer or key-derivation bug; the message is acked as a duplicate", nil,
			watermill.LogFields{"consumer": c.Consumer, "message_uuid": m.msg.UUID})
	}
	if c.Mode != ModeNaturalKey && !cr.New {
		m.state, m.out = settling, framework.Duplicate
		return true
	}
	produced, err := runHandler(m.msg, g.h, *tx, m.req.Key)
	if errors.Is(err, framework.ErrAlreadyApplied) {
		// Nothing of it stays in tx, but a later step may have found the
		// effect an earlier step of this group made: a duplicate only once
		// the group commits. A first step found it committed.
		m.state, m.out, m.found = settling, framework.Duplicate, true
		if !first {
			return g.rollbackStep(ctx, tx, first)
		}
		// Settled: its Kafka position is stored on its own, as the
		// per-message path does (a failure only leaves it low).
		m.state = committed
		ok := g.rollbackStep(ctx, tx, first)
		if err := c.storePosition(ctx, c.Store.Pool(), m.msg); err != nil {
			c.Logger.Debug("claimtx: storing the Kafka position of a duplicate failed", watermill.LogFields{"consumer": c.Consumer, "err": err.Error()})
		}
		return ok
	}
	if err == nil && len(produced) > 0 {
		if c.OutboxTopic == "" {
			err = framework.Permanent(ErrProducedMessages)
		} else {
			err = c.enqueue(ctx, *tx, produced)
		}
	}
	if err != nil {
		return g.undo(ctx, tx, first, m, err)
	}
	m.state, m.out = settling, framework.Applied
	m.res.Enqueued = len(produced)
	return true
}

// undo rolls m's step back after err: a failure of m's own is its result,
// one that says nothing about m (a lock wait, a deadlock, a lost
// connection, an ended context) leaves m alone.
func (g *grouper) undo(ctx context.Context, tx *pgx.Tx, first bool, m *member, err error) bool {
	cause := pg.Classify(err)
	switch {
	case ctx.Err() != nil && m.ctx.Err() == nil:
		m.state = alone // another member's end cut the step short
	case !first && !m.requeued && (cause == pg.ClaimWait || cause == pg.Deadlock):
		m.state = aside
	case cause.Transient() || m.ctx.Err() != nil:
		m.state, m.err = alone, err // the first attempt of the per-message path
	default:
		m.state, m.err = failed, err
	}
	m.res.Enqueued = 0
	return g.rollbackStep(ctx, tx, first)
}

// rollbackStep undoes the current step: the whole transaction for the
// first (the next step begins another), else back to its savepoint.
func (g *grouper) rollbackStep(ctx context.Context, tx *pgx.Tx, first bool) bool {
	if *tx == nil {
		return true // a first step that failed left no transaction
	}
	if first {
		pg.Rollback(ctx, *tx)
		*tx = nil
		return true
	}
	_, err := (*tx).Exec(ctx, pg.SavepointRollback)
	return err == nil
}
