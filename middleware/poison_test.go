package middleware_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

type failingPublisher struct{}

func (failingPublisher) Publish(string, ...*message.Message) error { return errors.New("broker down") }
func (failingPublisher) Close() error                              { return nil }

func TestPoison(t *testing.T) {
	t.Parallel()
	dead := newDeadLetters(t)

	var hooked []error
	p := middleware.Poison{Publisher: dead, Topic: "orders.poison", OnPoison: func(_ *message.Message, err error) { hooked = append(hooked, err) }}

	fail := func(err error) message.HandlerFunc {
		return func(*message.Message) ([]*message.Message, error) { return nil, err }
	}
	msg := message.NewMessage("m1", []byte("payload"))

	// Permanent: poisoned with the reason, original acked (nil error).
	_, err := testenv.Install(t, middleware.NewPoison, p)(fail(framework.Permanent(errors.New("undecodable"))))(msg)
	require.NoError(t, err)
	got := dead.next(t, "no poisoned copy published")
	require.Equal(t, "undecodable", got.Metadata.Get(middleware.PoisonReasonKey))
	require.Equal(t, "true", got.Metadata.Get("claimtx_poison_permanent"))
	require.Equal(t, "undecodable", got.Metadata.Get("reason_poisoned"))
	require.Equal(t, []byte("payload"), []byte(got.Payload))
	require.Len(t, hooked, 1)

	// Transient database failure: nacked, not poisoned.
	transient := fmt.Errorf("db down: %w", &pgconn.PgError{Code: "08006"})
	_, err = testenv.Install(t, middleware.NewPoison, p)(fail(transient))(msg)
	require.ErrorIs(t, err, transient)
	require.Len(t, hooked, 1)

	// Success passes through.
	_, err = testenv.Install(t, middleware.NewPoison, p)(fail(nil))(msg)
	require.NoError(t, err)

	// Poison topic unreachable: the original is nacked, never acked.
	bad := middleware.Poison{Publisher: failingPublisher{}, Topic: "x"}
	_, err = testenv.Install(t, middleware.NewPoison, bad)(fail(framework.Permanent(errors.New("boom"))))(msg)
	require.Error(t, err)
	require.Contains(t, err.Error(), "broker down")

	// Invalid config: refused by the constructor, so a poison route that
	// would nack every failing message forever cannot be installed.
	var ce *framework.ConfigError
	require.ErrorAs(t, configErr(middleware.NewPoison, middleware.Poison{Topic: "x"}), &ce)
	require.Equal(t, "Publisher", ce.Field)
	require.ErrorAs(t, configErr(middleware.NewPoison, middleware.Poison{Publisher: dead}), &ce)
	require.Equal(t, "Topic", ce.Field)
	mw, err := middleware.NewPoison(middleware.Poison{})
	require.ErrorAs(t, err, &ce)
	require.Nil(t, mw)
}

// A rolling deploy cancels the message contexts of the work in flight. The
// failure that follows says nothing about the message: it must go back to
// the broker (the error is returned, the router nacks), never to the poison
// topic, whatever the error looks like (Watermill's Retry returns the
// context's cause, "terminated signal received", which is no transient
// database failure).
func TestPoisonNeverDeadLettersInterruptedWork(t *testing.T) {
	t.Parallel()
	var published int
	p := middleware.Poison{Publisher: countingPublisher{&published}, Topic: "orders.poison"}
	for _, cause := range []error{context.Canceled, errors.New("terminated signal received"), framework.Permanent(errors.New("undecodable"))} {
		msg := message.NewMessage("m1", []byte("payload"))
		ctx, cancel := context.WithCancelCause(context.Background())
		msg.SetContext(ctx)
		cancel(errors.New("terminated signal received"))
		_, err := testenv.Install(t, middleware.NewPoison, p)(func(*message.Message) ([]*message.Message, error) { return nil, cause })(msg)
		require.ErrorIs(t, err, cause, "an interrupted message must be nacked")
	}
	require.Zero(t, published, "interrupted work was poisoned")
}

type countingPublisher struct{ n *int }

func (p countingPublisher) Publish(string, ...*message.Message) error { *p.n++; return nil }
func (countingPublisher) Close() error                                { return nil }

// A poisoned copy names who poisoned it, under which claim key and when,
// so `claimtx dlq` can list, classify and replay it; stamps of an earlier
// poisoning are replaced, and a key function that fails or panics stamps
// no key but never stops the copy.
func TestPoisonStampsCopies(t *testing.T) {
	t.Parallel()
	dead := newDeadLetters(t)
	key, err := framework.ParseKeySpec("template:order:{payload.order_id}")
	require.NoError(t, err)
	p := middleware.Poison{Publisher: dead, Topic: "orders.poison", Consumer: "loyalty", Key: key, SourceTopic: "orders"}
	fail := func(*message.Message) ([]*message.Message, error) {
		return nil, framework.Permanent(errors.New("bad deploy"))
	}
	next := func() *message.Message { return dead.next(t, "no poisoned copy published") }

	msg := message.NewMessage("m1", []byte(`{"order_id": 42}`))
	msg.Metadata.Set("event_id", "evt-42")
	msg.Metadata.Set("claimtx_poison_key", "stale")  // an earlier poisoning's
	msg.Metadata.Set("topic_poisoned", "elsewhere")  // idem
	msg.Metadata.Set("order_poisoned", "the user's") // not Watermill's: kept
	before := time.Now()
	_, err = testenv.Install(t, middleware.NewPoison, p)(fail)(msg)
	require.NoError(t, err)
	got := next()
	require.Equal(t, "loyalty", got.Metadata.Get("claimtx_poison_consumer"))
	require.Equal(t, "order:42", got.Metadata.Get("claimtx_poison_key"))
	require.Equal(t, "orders", got.Metadata.Get("topic_poisoned"), "outside a router the source topic comes from SourceTopic")
	require.Equal(t, "evt-42", got.Metadata.Get("event_id"))
	require.Equal(t, "the user's", got.Metadata.Get("order_poisoned"))
	require.Equal(t, "bad deploy", got.Metadata.Get("claimtx_poison_reason"))
	require.Equal(t, "true", got.Metadata.Get("claimtx_poison_permanent"))
	at := got.Metadata.Get("claimtx_poisoned_at")
	require.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z$`, at, "RFC 3339, UTC, nanoseconds")
	ts, err := time.Parse(time.RFC3339Nano, at)
	require.NoError(t, err)
	require.False(t, ts.Before(before.Add(-time.Microsecond)) || ts.After(time.Now()), "poisoned at %s", at)

	// Unkeyable: no key stamped, and no stale one left behind.
	bad := message.NewMessage("m2", []byte(`{"order_id": `))
	bad.Metadata.Set("claimtx_poison_key", "stale")
	_, err = testenv.Install(t, middleware.NewPoison, p)(fail)(bad)
	require.NoError(t, err)
	got = next()
	require.Empty(t, got.Metadata.Get("claimtx_poison_key"))
	require.Equal(t, "loyalty", got.Metadata.Get("claimtx_poison_consumer"))

	// A key function that panics: the copy still goes out, without a key.
	p.Key = func(*message.Message) (string, error) { panic("boom") }
	_, err = testenv.Install(t, middleware.NewPoison, p)(fail)(message.NewMessage("m3", []byte(`{}`)))
	require.NoError(t, err)
	got = next()
	require.Empty(t, got.Metadata.Get("claimtx_poison_key"))
	require.Equal(t, "m3", got.UUID)
}

// limitPublisher stands in for a broker's size rule: it refuses for good
// (framework.Permanent, as the built-in adapters report it) a message whose
// metadata is longer than limit bytes, fails with err when set, and keeps
// what it takes.
type limitPublisher struct {
	limit int
	err   error
	// before, when set, runs before each publish.
	before func()

	mu        sync.Mutex
	attempts  int
	published []*message.Message
}

func (p *limitPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attempts++
	if p.before != nil {
		p.before()
	}
	if p.err != nil {
		return p.err
	}
	for _, m := range msgs {
		n := 0
		for k, v := range m.Metadata {
			n += len(k) + len(v)
		}
		if p.limit > 0 && n > p.limit {
			return framework.Permanent(fmt.Errorf("test broker: headers of %d bytes, over %d", n, p.limit))
		}
	}
	p.published = append(p.published, msgs...)
	return nil
}

func (*limitPublisher) Close() error { return nil }

// refusals records OnRefused and OnPoison.
type refusals struct {
	mu       sync.Mutex
	refused  []middleware.PoisonRefusal
	poisoned []error
}

func (r *refusals) onRefused(_ *message.Message, x middleware.PoisonRefusal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refused = append(r.refused, x)
}

func (r *refusals) onPoison(_ *message.Message, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.poisoned = append(r.poisoned, err)
}

// longReason is an error whose text is n bytes, like Go's JSON error for an
// n-digit number, with an invalid UTF-8 byte and a NUL in it.
func longReason(n int) error {
	head := "json: cannot unmarshal number \xff\x00 "
	return framework.Permanent(errors.New(head + strings.Repeat("9", n-len(head))))
}

// TestPoisonReasonIsBounded: however long the error, a poisoned copy's
// reason (claimtx_poison_reason and Watermill's reason_poisoned) is at most
// 4096 bytes of valid UTF-8, and a cut one ends with the whole text's
// length and SHA-256; OnPoison still gets the whole error. A short reason
// is kept as it is.
func TestPoisonReasonIsBounded(t *testing.T) {
	t.Parallel()
	pub := &limitPublisher{}
	rec := &refusals{}
	p := middleware.Poison{Publisher: pub, Topic: "orders.poison", OnPoison: rec.onPoison}
	cause := longReason(40_000)
	_, err := testenv.Install(t, middleware.NewPoison, p)(func(*message.Message) ([]*message.Message, error) { return nil, cause })(message.NewMessage("m", []byte("{}")))
	require.NoError(t, err)
	require.Len(t, pub.published, 1)
	sum := sha256.Sum256([]byte(cause.Error()))
	for _, key := range []string{middleware.PoisonReasonKey, "reason_poisoned"} {
		reason := pub.published[0].Metadata.Get(key)
		require.LessOrEqual(t, len(reason), 4096, key)
		require.Greater(t, len(reason), 3900, "%s keeps as much as fits", key)
		require.True(t, utf8.ValidString(reason), key)
		require.NotContains(t, reason, "\x00", key)
		require.True(t, strings.HasPrefix(reason, "json: cannot unmarshal number \uFFFD\uFFFD 999"), key)
		require.True(t, strings.HasSuffix(reason, fmt.Sprintf("… [truncated: 40000 bytes, sha256:%s]", hex.EncodeToString(sum[:]))), "%s: …%s", key, reason[len(reason)-120:])
	}
	require.Equal(t, []error{cause}, rec.poisoned, "OnPoison gets the whole error")

	short := framework.Permanent(errors.New("customer_id is missing"))
	_, err = testenv.Install(t, middleware.NewPoison, p)(func(*message.Message) ([]*message.Message, error) { return nil, short })(message.NewMessage("m2", []byte("{}")))
	require.NoError(t, err)
	require.Equal(t, "customer_id is missing", pub.published[1].Metadata.Get(middleware.PoisonReasonKey))
}

// TestPoisonRefusedCopy: what happens when the broker refuses a poisoned
// copy, checked against a real Postgres. Near its limit a smaller copy
// (reason cut to 256 bytes) is published; over it the message is
// recorded in the dead-letter table, payload, headers and reason, and
// acked; without a dead-letter table, or when the row cannot be written,
// it is nacked. A failure the broker may get over, and interrupted work,
// are nacked without any fallback.
func TestPoisonRefusedCopy(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	dl := b.table("processed_messages_dead_letter")
	key, err := framework.ParseKeySpec("metadata:event_id")
	require.NoError(t, err)
	cause := longReason(40_000)
	fail := func(*message.Message) ([]*message.Message, error) { return nil, cause }
	newMsg := func(id string) *message.Message {
		m := message.NewMessage(id, []byte(`{"order_id": 9999}`))
		m.Metadata.Set("event_id", "evt-"+id)
		m.Metadata.Set("binary", "a\x00b\xff") // jsonb cannot hold it as a string
		m.SetContext(context.Background())
		return m
	}
	poison := func(pub *limitPublisher, rec *refusals, dead *store.Store) middleware.Poison {
		return middleware.Poison{
			Publisher: pub, Topic: "orders.poison", Consumer: "loyalty", Key: key, SourceTopic: "orders",
			DeadLetters: dead, OnPoison: rec.onPoison, OnRefused: rec.onRefused,
		}
	}
	rows := func() int { return int(b.scalar(t, "SELECT count(*) FROM "+dl)) }

	t.Run("smaller copy", func(t *testing.T) {
		pub, rec := &limitPublisher{limit: 2000}, &refusals{}
		_, err := testenv.Install(t, middleware.NewPoison, poison(pub, rec, b.store))(fail)(newMsg("near"))
		require.NoError(t, err, "acked")
		require.Equal(t, 2, pub.attempts)
		require.Len(t, pub.published, 1)
		reason := pub.published[0].Metadata.Get(middleware.PoisonReasonKey)
		require.LessOrEqual(t, len(reason), 256)
		require.Contains(t, reason, "truncated: 40000 bytes")
		require.Len(t, rec.refused, 1)
		require.Equal(t, "smaller_copy", rec.refused[0].Fallback)
		require.True(t, framework.IsPermanent(rec.refused[0].Err))
		require.Len(t, rec.poisoned, 1)
	})

	t.Run("dead-letter table", func(t *testing.T) {
		pub, rec := &limitPublisher{limit: 100}, &refusals{}
		msg := newMsg("over")
		_, err := testenv.Install(t, middleware.NewPoison, poison(pub, rec, b.store))(fail)(msg)
		require.NoError(t, err, "acked once the row is committed")
		require.Equal(t, 2, pub.attempts, "the copy, then a smaller one")
		require.Empty(t, pub.published)
		require.Len(t, rec.refused, 1)
		require.Equal(t, "dead_letter_table", rec.refused[0].Fallback)
		require.ErrorContains(t, rec.refused[0].Err, "smaller copy")
		require.Equal(t, []error{cause}, rec.poisoned)

		var consumer, msgKey, topic, poisonTopic, uuid, reason, publishErr, eventID, binary string
		var permanent bool
		var payload []byte
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT consumer, message_key, topic, poison_topic, uuid, reason, permanent,
publish_error, payload, metadata->>'event_id', metadata->'binary'->>'base64' FROM `+dl+` WHERE uuid = 'over'`).
			Scan(&consumer, &msgKey, &topic, &poisonTopic, &uuid, &reason, &permanent, &publishErr, &payload, &eventID, &binary))
		require.Equal(t, "loyalty", consumer)
		require.Equal(t, "evt-over", msgKey)
		require.Equal(t, "orders", topic)
		require.Equal(t, "orders.poison", poisonTopic)
		require.Equal(t, "over", uuid)
		require.LessOrEqual(t, len(reason), 4096)
		require.Contains(t, reason, "truncated: 40000 bytes")
		require.True(t, permanent)
		require.Contains(t, publishErr, "test broker: headers of")
		require.Equal(t, `{"order_id": 9999}`, string(payload))
		require.Equal(t, "evt-over", eventID)
		raw, err := base64.StdEncoding.DecodeString(binary)
		require.NoError(t, err)
		require.Equal(t, "a\x00b\xff", string(raw), "a header jsonb cannot hold is kept, base64")
	})

	t.Run("short reason: straight to the table", func(t *testing.T) {
		pub, rec := &limitPublisher{limit: 100}, &refusals{}
		_, err := testenv.Install(t, middleware.NewPoison, poison(pub, rec, b.store))(func(*message.Message) ([]*message.Message, error) {
			return nil, framework.Permanent(errors.New("bad"))
		})(newMsg("short"))
		require.NoError(t, err)
		require.Equal(t, 1, pub.attempts, "a smaller copy would be the same copy")
		require.Equal(t, "dead_letter_table", rec.refused[0].Fallback)
	})

	t.Run("no dead-letter table", func(t *testing.T) {
		pub, rec := &limitPublisher{limit: 100}, &refusals{}
		before := rows()
		_, err := testenv.Install(t, middleware.NewPoison, poison(pub, rec, nil))(fail)(newMsg("nowhere"))
		require.Error(t, err, "nacked: it is nowhere")
		require.ErrorIs(t, err, cause)
		require.Len(t, rec.refused, 1)
		require.Empty(t, rec.refused[0].Fallback)
		require.Empty(t, rec.poisoned)
		require.Equal(t, before, rows())
	})

	t.Run("row not written", func(t *testing.T) {
		// A store whose schema was never migrated: the insert fails.
		pool, schema := testenv.Setup(t, 2)
		unmigrated, err := store.New(pool, store.Config{Schema: schema})
		require.NoError(t, err)
		pub, rec := &limitPublisher{limit: 100}, &refusals{}
		_, err = testenv.Install(t, middleware.NewPoison, poison(pub, rec, unmigrated))(fail)(newMsg("unrecorded"))
		require.Error(t, err, "never acked without the row")
		require.ErrorContains(t, err, "record dead letter")
		require.Len(t, rec.refused, 1)
		require.Empty(t, rec.refused[0].Fallback)
		require.ErrorContains(t, rec.refused[0].Err, "record dead letter")
		require.Empty(t, rec.poisoned)
	})

	t.Run("broker unreachable", func(t *testing.T) {
		pub, rec := &limitPublisher{err: errors.New("connection reset")}, &refusals{}
		before := rows()
		_, err := testenv.Install(t, middleware.NewPoison, poison(pub, rec, b.store))(fail)(newMsg("transient"))
		require.ErrorContains(t, err, "connection reset", "nacked: the redelivery is poisoned again")
		require.Equal(t, 1, pub.attempts, "no smaller copy")
		require.Empty(t, rec.refused)
		require.Equal(t, before, rows(), "nothing in the table")
	})

	t.Run("interrupted", func(t *testing.T) {
		msg := newMsg("interrupted")
		ctx, cancel := context.WithCancel(context.Background())
		msg.SetContext(ctx)
		// The shutdown lands while the copy is being published, and the
		// broker's answer is a refusal.
		pub, rec := &limitPublisher{limit: 100, before: cancel}, &refusals{}
		before := rows()
		_, err := testenv.Install(t, middleware.NewPoison, poison(pub, rec, b.store))(fail)(msg)
		require.Error(t, err, "nacked, never dead-lettered")
		require.Equal(t, 1, pub.attempts, "no smaller copy")
		require.Empty(t, rec.refused)
		require.Equal(t, before, rows())
	})
}
