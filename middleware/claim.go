package middleware

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/committedkeys"
	"github.com/claimtx/claimtx/internal/config"
	"github.com/claimtx/claimtx/internal/kafkarecord"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
	"github.com/claimtx/claimtx/store"
)

// maxCommittedKeysTTL is half the shortest retention the store accepts
// without Force: an entry must expire long before cleanup may delete its
// claim.
const maxCommittedKeysTTL = pg.DefaultMinRetention / 2

// fingerprintBytes is how much of the SHA-256 is stored: 128 bits make an
// accidental collision between two payloads of one key negligible.
const fingerprintBytes = 16

// ErrProducedMessages is returned (as a permanent error) when a handler
// returns messages without Claim.OutboxTopic: the router would publish them
// outside the claim transaction, so a crash before the commit would emit
// them for no effect, and a redelivery again.
var ErrProducedMessages = errors.New("claimtx: handler returned messages, but the claim middleware has no outbox to write them to in the claim transaction (set Claim.OutboxTopic)")

// OutboxTopicMetadata, set on a message the handler returns, names its
// outbox topic instead of Claim.OutboxTopic; it is not stored.
const OutboxTopicMetadata = "claimtx_outbox_topic"

// ClaimMode selects what records that a message's effect was applied.
type ClaimMode string

const (
	// ModeClaimTable records each applied (consumer, key) in claimtx's
	// claim table with the effect. It works for any effect; retention
	// deletes the rows, after which a duplicate cannot be recognised.
	ModeClaimTable ClaimMode = "claim_table"
	// ModeNaturalKey uses the effect's own unique constraint as the claim:
	// the handler writes with a guarded statement (INSERT … ON CONFLICT
	// DO NOTHING RETURNING …) and returns framework.ErrAlreadyApplied when
	// it found the effect present (docs/effects.md). Such claims never
	// expire: the choice for money.
	ModeNaturalKey ClaimMode = "natural_key"
)

// Claim is the Watermill middleware that gives a handler exactly-once
// effects in Postgres. For each message it derives the key, opens a
// transaction, inserts the claim (consumer, key) and:
//
//   - claim inserted: runs the handler with the transaction in the message
//     context (framework.TxFromContext) and commits: Applied;
//   - claim existed: commits without calling the handler: Duplicate;
//   - handler error or panic: rolls back claim and effect together and
//     returns the error: Failed;
//   - handler returned framework.ErrAlreadyApplied: rolls back: Duplicate
//     (see ModeNaturalKey).
//
// Applied and Duplicate return nil: the router acks. Transient database
// failures (serialization, deadlock, claim-wait timeout, lost connection)
// retry the whole transaction, up to MaxAttempts with exponential backoff
// and full jitter.
//
// Build it as a struct literal and pass it to NewClaim, which validates
// it; docs/configuration.md tables every field.
type Claim struct {
	// Store is the claim store; its pool runs the claim transactions.
	// Required.
	Store *store.Store
	// Consumer names the effect being made idempotent ("loyalty"). Consumers
	// sharing a table keep separate claims. Required.
	Consumer string
	// Key derives the message key (framework.ParseKeySpec). Required in
	// ModeClaimTable; in ModeNaturalKey it is optional and only validated
	// and reported in Result.Key.
	Key framework.KeyFunc
	// Mode selects the claim: a claim-table row, or the effect's own unique
	// constraint. Defaults to ModeClaimTable.
	Mode ClaimMode
	// OrderKey derives the order key of a message (a key spec such as
	// "template:{payload.account_id}"): messages sharing one apply in the
	// order the broker delivers them, and when one fails for good (Park
	// parks it instead of Poison poisoning it) the later ones are parked
	// behind it, without running the handler, until Release releases the
	// key (docs/effects.md, "Ordered effects"). The lookup rides in the
	// claim's round trip. A message whose order key cannot be derived is
	// applied without one. Order needs the broker to hand over one
	// message of a key at a time: a Kafka partition, a RabbitMQ queue
	// with one consumer and a window of one. Not in ModeNaturalKey.
	// Defaults to nil: no order.
	OrderKey framework.KeyFunc
	// OutboxTopic enables the outbox for messages the handler returns:
	// each is written to Store's outbox table in the claim transaction,
	// addressed to its OutboxTopicMetadata or else to OutboxTopic, and
	// store/outbox's relay publishes it after the commit. A rolled-back or
	// duplicate delivery enqueues nothing. Defaults to "": returned
	// messages fail the message with ErrProducedMessages.
	OutboxTopic string
	// KeyPolicy validates derived keys. Defaults to a 512-byte limit,
	// over-long keys refused.
	KeyPolicy framework.KeyPolicy
	// Isolation of the claim transaction. SERIALIZABLE works: twins then
	// fail with 40001 instead of waiting, and the retry sees the claim.
	// Defaults to READ COMMITTED.
	Isolation pgx.TxIsoLevel
	// MaxClaimWait bounds the wait behind a concurrent twin's uncommitted
	// claim (Result.ClaimWait) before the attempt fails transiently. Keep
	// it above your handler's normal duration, or twins of slow messages
	// burn attempts. In ModeNaturalKey it is the lock_timeout of the whole
	// transaction. Defaults to 5s.
	MaxClaimWait time.Duration
	// SynchronousCommit is the claim transaction's synchronous_commit
	// ("on", "remote_write", "remote_apply", "local"): what its COMMIT, and
	// so an ack, waits for (docs/reliability.md, "Acked means durable").
	// "off" is refused: a crash of the database alone could lose an acked
	// effect. Defaults to "": the session's setting applies.
	SynchronousCommit string
	// MaxGroup bounds group commit: messages delivered and waiting for the
	// claim are applied in one transaction, each under its own claim and
	// savepoint, and acked after its one COMMIT; a failing message is
	// rolled back to its savepoint and handled alone, and one that meets a
	// lock held elsewhere ends its group and leads the next one. A
	// group never waits for messages to arrive (docs/design.md, "Group
	// commit"). It needs Isolation READ COMMITTED; at other levels every
	// message has its own transaction. 1 turns it off. Defaults to 16.
	MaxGroup int
	// MaxGroupTime bounds the time a group spends in claims and handlers
	// before it commits, and so how long a twin waits behind it. Defaults
	// to 50ms.
	MaxGroupTime time.Duration
	// MaxAttempts bounds transaction attempts for transient failures
	// (1 disables retrying). Defaults to 5.
	MaxAttempts int
	// InitialBackoff is the wait before the second attempt; it doubles each
	// attempt up to MaxBackoff, with full jitter. Defaults to 10ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the wait between attempts. Defaults to 1s.
	MaxBackoff time.Duration
	// EventTime derives the producer's event time of a message, for a
	// claim table partitioned by event day (store.EnablePartitioning): the
	// claim goes into that day's partition, the same on every redelivery,
	// so twins meet. A message without a usable event time is poisoned.
	// Defaults to nil: the plain claim table.
	EventTime framework.TimeFunc
	// AllowBrokerEventTime lets EventTime read a time stamped on each copy
	// rather than by the producer, such as "kafka:timestamp"; NewClaim
	// refuses such an EventTime otherwise (it probes EventTime with a
	// message carrying only a record timestamp). Sharp edge: a copy
	// restamped by LogAppendTime, a mirror or another producer claims in
	// another day's partition and is applied twice. Defaults to false.
	AllowBrokerEventTime bool
	// Fingerprint stores a 16-byte payload hash with each claim and
	// compares it on a duplicate (one more query each): a mismatch, same
	// key for different content, is reported in Result.FingerprintMismatch
	// and logged; the duplicate is still acked. Defaults to false.
	Fingerprint bool
	// PoisonMemo sends a later delivery of a dead-lettered (consumer, key)
	// to the poison destination too, without running the handler, until
	// `claimtx unpoison`, the dead-letter replay or retention clears the
	// memo (docs/operations.md). With this middleware alone, pass
	// RecordPoison as Poison.OnPoison. Not in ModeNaturalKey. Defaults to
	// false: a memo is a standing verdict that outlives the deploy that
	// fixes its cause.
	PoisonMemo bool
	// CommittedKeys bounds the committed-key cache (one per NewClaim), which
	// acks a copy of a key seen committed without a round trip
	// (docs/operations.md, "Committed-key cache"). Sharp edge: deleting
	// claims by hand, or cleanup with Force below CommittedKeysTTL, while
	// consumers run makes them ack cached keys' copies without the effect
	// until the entry expires. Negative disables it. Defaults to 100,000.
	CommittedKeys int
	// CommittedKeysTTL is how long a cache entry is trusted. It must stay
	// far below the claim retention (at most half of store's smallest
	// retention without Force; framework/consumer also caps it at half of
	// Config.Retention). Defaults to 10 minutes.
	CommittedKeysTTL time.Duration
	// NoPositions turns off the Kafka positions stored with the claims: by
	// default each claim transaction of a Kafka record raises its
	// partition's settled position, so framework/consumer can start a
	// partition past records already settled when the group's offset is
	// behind (docs/design.md, "Kafka positions"). Defaults to false.
	NoPositions bool
	// ReplayBelowPositions makes framework/consumer's Kafka subscriber
	// start at the group's offset even below the stored position, for an
	// operator's deliberate replay in which the claims decide. Defaults to
	// false: such records are skipped, with a WARN line and
	// claimtx_kafka_positions_skipped_total.
	ReplayBelowPositions bool
	// OnOutcome, when set, is called once per pass through the middleware.
	// Retry and Poison above it may run a message again or dead-letter a
	// Failed pass: to count messages, report at settlement as
	// framework/consumer does (docs/observability.md). It runs on the
	// handler goroutine: keep it fast.
	OnOutcome func(Result)
	// OnRetry, when set, is called before each retry of a transient failure.
	OnRetry func(TxRetry)
	// Logger receives debug lines for duplicates and retries. Defaults to
	// no logging.
	Logger watermill.LoggerAdapter

	// Set by withDefaults; positions, parking, cache and ahead are nil
	// when off.
	claims    pg.Claims
	parking   pg.Parking
	positions pg.Positions
	cache     *committedkeys.Cache
	now       func() time.Time // the cache's clock (time.Now when nil)
	ahead     *committedkeys.ReadAhead
}

// Result describes one message's passage through the middleware.
type Result struct {
	Consumer string
	// Key is the claimed key (after KeyPolicy). Empty when the message
	// could not be keyed. It may be sensitive: avoid logging it verbatim.
	Key     string
	Outcome framework.Outcome
	// Attempts counts the claim transactions run: 0 when the committed-key
	// cache answered (Duplicate) or the message could not be keyed (Failed).
	Attempts int
	// Err is the error returned to the router (nil for Applied/Duplicate).
	Err error
	// ClaimWait is how long BEGIN and the claim took on the last attempt,
	// pool and twin waits included. Zero in ModeNaturalKey.
	ClaimWait time.Duration
	// Enqueued counts the messages the committed attempt wrote to the
	// outbox (0 unless Applied).
	Enqueued int
	// Duration is the whole time spent in the middleware.
	Duration time.Duration
	// FingerprintMismatch is set on a Duplicate whose payload differs from
	// the original's: a producer or key-derivation bug.
	FingerprintMismatch bool
	// Unordered is set when Claim.OrderKey could not derive the message's
	// order key (a missing field, a key KeyPolicy refuses): it was applied
	// without order, and logged.
	Unordered bool
	Message   *message.Message
}

// TxRetry describes a transient failure of a claim transaction about to
// be retried.
type TxRetry struct {
	Consumer string
	Attempt  int    // the attempt that failed, from 1
	Cause    string // "serialization", "deadlock", "claim_wait" or "connection"
	Err      error
	Delay    time.Duration
}

// validate reports the first invalid field as a *framework.ConfigError.
func (c Claim) validate() error {
	switch {
	case c.Store == nil:
		return &framework.ConfigError{Field: "Store", Reason: "must not be nil"}
	case c.Key == nil && c.Mode != ModeNaturalKey:
		return &framework.ConfigError{Field: "Key", Reason: "must not be nil (e.g. framework.ParseKeySpec(\"metadata:event_id\"))"}
	case c.Mode != "" && c.Mode != ModeClaimTable && c.Mode != ModeNaturalKey:
		return &framework.ConfigError{Field: "Mode", Reason: fmt.Sprintf("%q is not a mode (%q or %q)", c.Mode, ModeClaimTable, ModeNaturalKey)}
	case len(c.OutboxTopic) > pg.MaxOutboxTopicBytes:
		return &framework.ConfigError{Field: "OutboxTopic", Reason: fmt.Sprintf("is %d bytes, longer than %d", len(c.OutboxTopic), pg.MaxOutboxTopicBytes)}
	case !pg.Storable(c.OutboxTopic):
		return &framework.ConfigError{Field: "OutboxTopic", Reason: "must be valid UTF-8 without NUL bytes"}
	case c.MaxAttempts < 0:
		return &framework.ConfigError{Field: "MaxAttempts", Reason: "must not be negative"}
	case c.MaxClaimWait < 0:
		return &framework.ConfigError{Field: "MaxClaimWait", Reason: "must not be negative"}
	case c.MaxGroup < 0 || c.MaxGroup > maxMaxGroup:
		return &framework.ConfigError{Field: "MaxGroup", Reason: fmt.Sprintf("must be from 0 (the default) to %d, got %d", maxMaxGroup, c.MaxGroup)}
	case c.MaxGroupTime < 0:
		return &framework.ConfigError{Field: "MaxGroupTime", Reason: "must not be negative"}
	case c.InitialBackoff < 0 || c.MaxBackoff < 0:
		return &framework.ConfigError{Field: "InitialBackoff", Reason: "backoffs must not be negative"}
	case c.CommittedKeysTTL < 0:
		return &framework.ConfigError{Field: "CommittedKeysTTL", Reason: "must not be negative"}
	case c.CommittedKeysTTL > maxCommittedKeysTTL:
		return &framework.ConfigError{Field: "CommittedKeysTTL", Reason: fmt.Sprintf("%s is more than %s, half the shortest claim retention the store accepts without Force: a cached key could outlive its claim", c.CommittedKeysTTL, maxCommittedKeysTTL)}
	case c.KeyPolicy.MaxBytes < 0:
		return &framework.ConfigError{Field: "KeyPolicy.MaxBytes", Reason: "must not be negative"}
	case c.OrderKey != nil && c.Mode == ModeNaturalKey:
		return &framework.ConfigError{Field: "OrderKey", Reason: "not supported in ModeNaturalKey: parking a message undoes its claim, which there is the handler's own statement"}
	case c.PoisonMemo && c.Mode == ModeNaturalKey:
		return &framework.ConfigError{Field: "PoisonMemo", Reason: "not supported in ModeNaturalKey: the claim is the handler's own statement, so a memo could not tell an applied message from a dead-lettered one before the handler runs"}
	case c.EventTime != nil && c.Mode != ModeNaturalKey && !c.AllowBrokerEventTime && readsBrokerTime(c.EventTime):
		return &framework.ConfigError{Field: "EventTime", Reason: brokerEventTimeRisk}
	case !slices.Contains([]pgx.TxIsoLevel{"", pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}, c.Isolation):
		return &framework.ConfigError{Field: "Isolation", Reason: fmt.Sprintf("%q is not supported (READ COMMITTED, REPEATABLE READ or SERIALIZABLE)", c.Isolation)}
	}
	if err := pg.CheckSynchronousCommit(c.SynchronousCommit); err != nil {
		return &framework.ConfigError{Field: "SynchronousCommit", Reason: err.Error()}
	}
	return config.ValidateConsumer("Consumer", c.Consumer)
}

func (c Claim) withDefaults() Claim {
	c.Isolation = cmp.Or(c.Isolation, pgx.ReadCommitted)
	c.Mode = cmp.Or(c.Mode, ModeClaimTable)
	c.MaxClaimWait = cmp.Or(c.MaxClaimWait, pg.DefaultMaxClaimWait)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, pg.DefaultMaxAttempts)
	c.MaxGroup = cmp.Or(c.MaxGroup, pg.DefaultMaxGroup)
	c.MaxGroupTime = cmp.Or(c.MaxGroupTime, pg.DefaultMaxGroupTime)
	c.InitialBackoff = cmp.Or(c.InitialBackoff, pg.DefaultInitialBackoff)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, pg.DefaultMaxBackoff)
	c.CommittedKeys = cmp.Or(c.CommittedKeys, committedkeys.DefaultSize)
	c.CommittedKeysTTL = cmp.Or(c.CommittedKeysTTL, committedkeys.DefaultTTL)
	c.Logger = cmp.Or[watermill.LoggerAdapter](c.Logger, watermill.NopLogger{})
	c.claims = pg.ClaimsOf(c.Store)
	if c.OrderKey != nil {
		c.parking = pg.ParkingOf(c.Store)
	}
	if !c.NoPositions {
		c.positions = c.claims.Positions()
	}
	// Only claim-table rows provably stay committed (only retention removes
	// them; the application may delete a natural key's row), and a
	// Fingerprint check needs the stored claim of every duplicate.
	if c.Mode == ModeClaimTable && !c.Fingerprint {
		c.cache = committedkeys.New(c.CommittedKeys, c.CommittedKeysTTL, c.now)
	}
	// The read-ahead's statement does not read event days.
	if c.EventTime == nil {
		c.ahead = committedkeys.NewReadAhead(c.cache, c.CommittedKeys, c.Consumer, c.Logger, c.claims.Following)
	}
	return c
}

// NewClaim validates c and returns its middleware, so a claim that would
// fail every message (a hot redelivery loop) cannot be installed.
func NewClaim(c Claim) (message.HandlerMiddleware, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	// Defaults here, not per handler: every handler shares one cache, so
	// CommittedKeys bounds its memory.
	return c.withDefaults().middleware, nil
}

func (c Claim) txOptions() pg.TxOptions {
	return pg.TxOptions{TxOptions: pgx.TxOptions{IsoLevel: c.Isolation}, SynchronousCommit: c.SynchronousCommit}
}

func (c Claim) middleware(h message.HandlerFunc) message.HandlerFunc {
	txOpts := c.txOptions()
	var g *grouper
	if c.grouping() {
		g = newGrouper(c, h)
	}
	return func(msg *message.Message) ([]*message.Message, error) {
		start := time.Now()
		// Until the cache has answered, outcomes are reported from a
		// Result on the stack: the slow path's escapes (it is shared by
		// pointer), and a duplicate storm is mostly cache hits.
		key, err := c.key(msg)
		if err != nil {
			// The same message fails the same way: poison, never retry.
			return c.report(Result{Message: msg}, start, framework.Failed, framework.Permanent(err))
		}
		req := pg.ClaimRequest{Consumer: c.Consumer, Key: key, MaxClaimWait: c.MaxClaimWait}
		look, unordered := c.lookups(msg)
		var day int64 // of the cache key: claims by event day are distinct per day
		if c.EventTime != nil && c.Mode != ModeNaturalKey {
			if req.EventTime, err = c.EventTime(msg); err != nil {
				return c.report(Result{Message: msg, Key: key, Unordered: unordered}, start, framework.Failed, framework.Permanent(err))
			}
			if !req.EventTime.IsZero() {
				day = pg.EventDay(req.EventTime).Unix() / 86400
			}
		}
		hash := c.cache.Key(c.Consumer, day, key)
		if c.cached(msg.Context(), hash) {
			return c.report(Result{Message: msg, Key: key, Unordered: unordered}, start, framework.Duplicate, nil)
		}
		res := Result{Consumer: c.Consumer, Message: msg, Key: key, Unordered: unordered}
		finish := func(out framework.Outcome, err error) ([]*message.Message, error) {
			return c.report(res, start, out, err)
		}
		var groupErr error // the transient failure of msg's step in a group: its first attempt
		if g != nil {
			m := &member{msg: msg, req: req, look: look, hash: hash, res: &res}
			if g.do(m); m.state != alone {
				res.Attempts = 1
				if m.state == failed {
					return finish(framework.Failed, m.err)
				}
				return finish(m.out, nil)
			}
			groupErr = m.err
			res.Enqueued, res.FingerprintMismatch = 0, false
		}
		began := c.ahead.Started()
		for attempt := 1; ; attempt++ {
			res.Attempts = attempt
			var out framework.Outcome
			var err error
			if attempt == 1 && groupErr != nil {
				err = groupErr
			} else {
				out, err = c.attempt(msg, h, req, look, hash, began, txOpts, &res)
			}
			if err == nil {
				if out == framework.Duplicate {
					c.Logger.Debug("claimtx: duplicate delivery acked without running the handler", watermill.LogFields{"consumer": c.Consumer, "message_uuid": msg.UUID})
				}
				return finish(out, nil)
			}
			cause := pg.Classify(err)
			if !cause.Transient() || msg.Context().Err() != nil {
				return finish(framework.Failed, err)
			}
			if attempt >= c.MaxAttempts {
				return finish(framework.Failed, fmt.Errorf("claimtx: consumer %q: giving up after %d attempts: %w", c.Consumer, attempt, err))
			}
			if err := c.pause(msg.Context(), attempt, cause, err); err != nil {
				return finish(framework.Failed, fmt.Errorf("claimtx: consumer %q: retry abandoned: %w", c.Consumer, err))
			}
		}
	}
}

// report completes r with the outcome and hands it to OnOutcome.
func (c *Claim) report(r Result, start time.Time, out framework.Outcome, err error) ([]*message.Message, error) {
	r.Consumer, r.Outcome, r.Err, r.Duration = c.Consumer, out, err, time.Since(start)
	if c.OnOutcome != nil {
		c.OnOutcome(r)
	}
	return nil, err
}

// key derives and normalizes the message key; "" without a Key.
func (c Claim) key(msg *message.Message) (string, error) {
	if c.Key == nil {
		return "", nil
	}
	key, err := c.Key(msg)
	if err != nil {
		return "", err
	}
	return c.KeyPolicy.Normalize(key)
}

// orderKey is msg's order key under KeyPolicy; "" without OrderKey. An
// error says OrderKey could not derive a usable key: msg is then applied
// without order.
func (c Claim) orderKey(msg *message.Message) (string, error) {
	if c.OrderKey == nil {
		return "", nil
	}
	k, err := c.OrderKey(msg)
	if err == nil && k == "" {
		err = errors.New("empty order key")
	}
	if err == nil {
		k, err = c.KeyPolicy.Normalize(k)
	}
	if err != nil {
		return "", fmt.Errorf("claimtx: order key: %w", err)
	}
	return k, nil
}

// lookups is msg's lookups for its claim, and whether msg goes without
// the order OrderKey asks for, which it logs: a producer that leaves the
// field out, or a hostile over-long key, must not lose order unseen.
func (c Claim) lookups(msg *message.Message) (pg.Lookups, bool) {
	k, err := c.orderKey(msg)
	if err != nil {
		c.Logger.Info("claimtx: no usable order key: the message is applied without order", watermill.LogFields{"consumer": c.Consumer, "message_uuid": msg.UUID, "err": err.Error()})
	}
	return pg.Lookups{Memo: c.PoisonMemo, OrderKey: k}, err != nil
}

// parkBehind parks msg in tx, whose claim found msg's order key parked.
func (c Claim) parkBehind(ctx context.Context, tx pgx.Tx, msg *message.Message, key, orderKey string) error {
	return c.parking.ParkBehind(ctx, tx, parked(c.Consumer, msg, key, orderKey, ""))
}

// parked is the row that parks msg.
func parked(consumer string, msg *message.Message, key, orderKey, reason string) pg.ParkedMessage {
	return pg.ParkedMessage{Consumer: consumer, OrderKey: orderKey, Key: key, UUID: msg.UUID, Payload: msg.Payload, Metadata: msg.Metadata, Reason: reason}
}

// attempt runs one claim transaction; every path that does not commit
// rolls back, so claim and effect share one fate. Only a commit caches the
// key, new or duplicate alike: a claim that met an uncommitted twin waited
// for its end, and under REPEATABLE READ and SERIALIZABLE a committed claim
// outside the snapshot fails with 40001 instead of conflicting.
func (c Claim) attempt(msg *message.Message, h message.HandlerFunc, req pg.ClaimRequest, look pg.Lookups, hash committedkeys.Hash, began uint64, txOpts pg.TxOptions, res *Result) (out framework.Outcome, err error) {
	ctx := msg.Context()
	res.ClaimWait = 0
	claimed := true
	early := c.earlyPosition(msg)
	var tx pgx.Tx
	var produced []*message.Message
	if c.Mode == ModeNaturalKey {
		// The claim is the handler's guarded INSERT: MaxClaimWait bounds
		// its wait behind a twin, set with BEGIN.
		if tx, err = c.claims.BeginNaturalKey(ctx, txOpts, c.MaxClaimWait, early); err != nil {
			return "", err
		}
	} else {
		req.PayloadHash = c.payloadHash(msg)
		claimStart := time.Now()
		var cr pg.ClaimResult
		var found pg.Found
		// BEGIN and the claim (and the lookups) in one round trip.
		tx, cr, found, err = c.claims.Begin(ctx, txOpts, req, look, early)
		res.ClaimWait = time.Since(claimStart)
		if err != nil {
			return "", err
		}
		if cr.New && found.Memo != nil {
			// Dead-lettered before: undo the claim, poison this copy too.
			pg.Rollback(ctx, tx)
			return "", framework.Permanent(&poison.HitError{Reason: *found.Memo})
		}
		if cr.New && found.Parked {
			return c.commitParked(ctx, tx, msg, req.Key, look.OrderKey, early == nil)
		}
		claimed = cr.New
		res.FingerprintMismatch = cr.FingerprintMismatch
		if cr.FingerprintMismatch {
			c.Logger.Error("claimtx: duplicate key with a different payload: a producer or key-derivation bug; the message is acked as a duplicate", nil,
				watermill.LogFields{"consumer": c.Consumer, "message_uuid": msg.UUID})
		}
	}
	// A no-op once committed; it runs even on a cancelled context, so the
	// connection returns to the pool clean.
	defer pg.Rollback(ctx, tx)
	out = framework.Duplicate
	if claimed {
		produced, err = runHandler(msg, h, tx, req.Key)
		if errors.Is(err, framework.ErrAlreadyApplied) {
			// Undo whatever else this delivery wrote and ack; the record
			// is settled, so its position is stored on its own. A failure
			// only leaves it low: claims still catch redeliveries.
			pg.Rollback(ctx, tx)
			if err := c.storePosition(ctx, c.Store.Pool(), msg); err != nil {
				c.Logger.Debug("claimtx: storing the Kafka position of a duplicate failed", watermill.LogFields{"consumer": c.Consumer, "err": err.Error()})
			}
			return framework.Duplicate, nil
		}
		if err != nil {
			return "", err
		}
		if len(produced) > 0 {
			if c.OutboxTopic == "" {
				return "", framework.Permanent(ErrProducedMessages)
			}
			if err := c.enqueue(ctx, tx, produced); err != nil {
				return "", err
			}
		}
		out = framework.Applied
	}
	// Last before COMMIT: the position row is the last lock taken.
	if early == nil {
		if err := c.storePosition(ctx, tx, msg); err != nil {
			return "", err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		// Ambiguous, but a retry or redelivery meets the claim if it did.
		return "", fmt.Errorf("claimtx: commit: %w", err)
	}
	res.Enqueued = len(produced) // only a committed attempt's count
	c.cache.Add(hash)
	if claimed {
		c.ahead.Answered(ctx, began, nil, true)
	} else {
		c.ahead.Answered(ctx, began, []string{req.Key}, false)
	}
	return out, nil
}

// commitParked parks msg behind its parked order key in tx, its claim
// undone, and commits: the record is settled (acked), so its Kafka
// position is stored too, unless it went with the claim (positioned). The
// key is not cached: msg is not applied.
func (c Claim) commitParked(ctx context.Context, tx pgx.Tx, msg *message.Message, key, orderKey string, position bool) (framework.Outcome, error) {
	defer pg.Rollback(ctx, tx)
	if err := c.parkBehind(ctx, tx, msg, key, orderKey); err != nil {
		return "", err
	}
	if position {
		if err := c.storePosition(ctx, tx, msg); err != nil {
			return "", err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("claimtx: commit: %w", err)
	}
	return framework.Parked, nil
}

// payloadHash is msg's fingerprint, nil without Fingerprint.
func (c Claim) payloadHash(msg *message.Message) []byte {
	if !c.Fingerprint {
		return nil
	}
	sum := sha256.Sum256(msg.Payload)
	return sum[:fingerprintBytes]
}

// settled is the Kafka position msg settles once its transaction commits,
// and how many records of its partition are in flight; false when there is
// none to store (positions off, no record, partition no longer ours).
func (c Claim) settled(msg *message.Message) (p kafkarecord.Settled, window int, ok bool) {
	if c.positions == nil {
		return p, 0, false
	}
	r, ok := kafkarecord.FromContext(msg.Context())
	if !ok || r.Of == nil {
		return p, 0, false
	}
	off, ok := r.Of.SettledBelow([]int64{r.Offset})
	return kafkarecord.Settled{Topic: r.Topic, Partition: r.Partition, SettledBelow: off}, r.Window, ok
}

// earlyPosition queues msg's Kafka position in the claim's first round
// trip, or is nil (storePosition runs last instead): with a window in
// flight, transactions holding the position row from the start would wait
// for each other's whole length instead of for a commit.
func (c Claim) earlyPosition(msg *message.Message) func(*pgx.Batch) {
	p, window, ok := c.settled(msg)
	if !ok || window != 1 {
		return nil
	}
	return func(b *pgx.Batch) { c.positions.Queue(b, c.Consumer, p) }
}

// storePosition raises, in db, the stored Kafka position of msg's partition.
func (c Claim) storePosition(ctx context.Context, db pg.Execer, msg *message.Message) error {
	if p, _, ok := c.settled(msg); ok {
		return c.positions.Store(ctx, db, c.Consumer, []kafkarecord.Settled{p})
	}
	return nil
}

// cached reports whether the committed-key cache holds h. A hit on the
// mark of a page read ahead reads the next page first.
func (c Claim) cached(ctx context.Context, h committedkeys.Hash) bool {
	hit, mark := c.cache.Lookup(h)
	if mark {
		c.ahead.Marked(ctx)
	}
	return hit
}

// enqueue writes produced to the outbox in tx, one statement per topic.
// The relay publishes per topic, so only the order within one is kept.
func (c Claim) enqueue(ctx context.Context, tx pgx.Tx, produced []*message.Message) error {
	var topics []string
	byTopic := make(map[string][]*message.Message)
	for i, m := range produced {
		if m == nil {
			return framework.Permanent(fmt.Errorf("%w: handler returned a nil message at index %d", store.ErrInvalidOutboxMessage, i))
		}
		cp := m.Copy()
		topic := cmp.Or(cp.Metadata.Get(OutboxTopicMetadata), c.OutboxTopic)
		delete(cp.Metadata, OutboxTopicMetadata)
		if _, seen := byTopic[topic]; !seen {
			topics = append(topics, topic)
		}
		byTopic[topic] = append(byTopic[topic], cp)
	}
	for _, t := range topics {
		if err := c.Store.Enqueue(ctx, tx, t, byTopic[t]...); err != nil {
			return err
		}
	}
	return nil
}

// runHandler calls h with tx and key in the message context, a panic
// turned into an error (see guard).
func runHandler(msg *message.Message, h message.HandlerFunc, tx pgx.Tx, key string) (produced []*message.Message, err error) {
	orig := msg.Context()
	msg.SetContext(pg.WithKey(pg.WithTx(orig, tx), key))
	defer msg.SetContext(orig)
	err = guard(func() (err error) {
		produced, err = h(msg)
		return err
	})
	return produced, err
}

// pause tells OnRetry and the logger, then waits out the backoff after a
// transient failure; it returns ctx's error when ctx ended the wait.
func (c Claim) pause(ctx context.Context, attempt int, cause pg.Cause, err error) error {
	d := c.InitialBackoff << (attempt - 1)
	if d > c.MaxBackoff || d <= 0 {
		d = c.MaxBackoff
	}
	// Full jitter: twins that failed together must not retry together.
	delay := time.Duration(rand.Int64N(int64(d)) + 1)
	if c.OnRetry != nil {
		c.OnRetry(TxRetry{Consumer: c.Consumer, Attempt: attempt, Cause: cause.String(), Err: err, Delay: delay})
	}
	c.Logger.Debug("claimtx: transient failure, retrying the claim transaction", watermill.LogFields{"consumer": c.Consumer, "attempt": attempt, "cause": cause.String(), "delay": delay})
	return pg.Sleep(ctx, delay)
}
