package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/middleware"
	"github.com/jackc/pgx/v5/pgconn"
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
	_, err := install(t, middleware.NewPoison, p)(fail(framework.Permanent(errors.New("undecodable"))))(msg)
	require.NoError(t, err)
	got := dead.next(t, "no poisoned copy published")
	require.Equal(t, "undecodable", got.Metadata.Get(middleware.PoisonReasonKey))
	require.Equal(t, "true", got.Metadata.Get("claimtx_poison_permanent"))
	require.Equal(t, "undecodable", got.Metadata.Get("reason_poisoned"))
	require.Equal(t, []byte("payload"), []byte(got.Payload))
	require.Len(t, hooked, 1)

	// Transient database failure: nacked, not poisoned.
	transient := fmt.Errorf("db down: %w", &pgconn.PgError{Code: "08006"})
	_, err = install(t, middleware.NewPoison, p)(fail(transient))(msg)
	require.ErrorIs(t, err, transient)
	require.Len(t, hooked, 1)

	// Success passes through.
	_, err = install(t, middleware.NewPoison, p)(fail(nil))(msg)
	require.NoError(t, err)

	// Poison topic unreachable: the original is nacked, never acked.
	bad := middleware.Poison{Publisher: failingPublisher{}, Topic: "x"}
	_, err = install(t, middleware.NewPoison, bad)(fail(framework.Permanent(errors.New("boom"))))(msg)
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
		_, err := install(t, middleware.NewPoison, p)(func(*message.Message) ([]*message.Message, error) { return nil, cause })(msg)
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
	_, err = install(t, middleware.NewPoison, p)(fail)(msg)
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
	_, err = install(t, middleware.NewPoison, p)(fail)(bad)
	require.NoError(t, err)
	got = next()
	require.Empty(t, got.Metadata.Get("claimtx_poison_key"))
	require.Equal(t, "loyalty", got.Metadata.Get("claimtx_poison_consumer"))

	// A key function that panics: the copy still goes out, without a key.
	p.Key = func(*message.Message) (string, error) { panic("boom") }
	_, err = install(t, middleware.NewPoison, p)(fail)(message.NewMessage("m3", []byte(`{}`)))
	require.NoError(t, err)
	got = next()
	require.Empty(t, got.Metadata.Get("claimtx_poison_key"))
	require.Equal(t, "m3", got.UUID)
}
