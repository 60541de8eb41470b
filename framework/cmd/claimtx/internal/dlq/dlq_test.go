package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq/dlqtest"
)

const (
	consumer = "loyalty"
	keySpec  = "template:order:{payload.order_id}"
)

func classifier(t *testing.T, pool *pgxpool.Pool, schema string) *dlq.Classifier {
	t.Helper()
	key, err := framework.ParseKeySpec(keySpec)
	require.NoError(t, err)
	return &dlq.Classifier{Pool: pool, Schema: schema, Table: "processed_messages", Consumer: consumer, Key: key}
}

func open(t *testing.T, w *dlqtest.World, resume bool) dlq.Source {
	t.Helper()
	src, err := dlq.Open(context.Background(), w.Broker, dlq.Options{Destination: w.Poison, Consumer: consumer, Resume: resume})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	return src
}

func uuids(msgs []*message.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.UUID
	}
	return out
}

// Browsing reads every message of the destination in its order and takes
// none away: twice in a row it sees the same messages, and the
// destination holds them all afterwards, in the same order.
func TestBrowseTakesNothing(t *testing.T) {
	dlqtest.EachBroker(t, 1, func(t *testing.T, w *dlqtest.World) {
		orders := dlqtest.Orders(1, 25)
		w.Publish(w.Poison, w.Poisoned(consumer, keySpec, framework.Permanent(errors.New("bad deploy")), orders...)...)
		before := uuids(w.Read(w.Poison))
		require.Len(t, before, 25)
		for range 2 {
			src := open(t, w, false)
			require.EqualValues(t, 25, src.Total())
			var seen []string
			r := dlq.Run{Source: src, BatchSize: 7, OnLetter: func(l *dlq.Letter) error {
				seen = append(seen, l.Msg.UUID)
				require.Equal(t, consumer, l.Stamps.Consumer)
				require.Equal(t, w.Topic, l.Stamps.Topic)
				require.Equal(t, "bad deploy", l.Stamps.Reason)
				require.Equal(t, fmt.Sprintf("order:%d", dlqtest.OrderID(l.Msg)), l.Stamps.Key)
				require.WithinDuration(t, time.Now(), l.Stamps.PoisonedAt, time.Minute)
				return nil
			}}
			tot, err := r.Browse(context.Background())
			require.NoError(t, err)
			require.EqualValues(t, 25, tot.Seen)
			require.Equal(t, before, seen, "destination order")
			require.NoError(t, src.Close())
			require.Equal(t, before, uuids(w.Read(w.Poison)), "nothing taken, order kept")
		}
	})
}

// The dry run classifies each dead letter against the claims; the replay
// republishes exactly the ones that would apply, with their identity and
// without the poison bookkeeping, and removes them from the destination
// (RabbitMQ, NATS) or records its progress past them (Kafka); a second replay
// finds nothing more to do.
func TestClassifyAndReplay(t *testing.T) {
	dlqtest.EachBroker(t, 1, func(t *testing.T, w *dlqtest.World) {
		ctx := context.Background()
		var orders []*message.Message
		for i := 1; i <= 9; i++ {
			m := dlqtest.Order(i)
			if w.Kind == brokers.KindKafka {
				m.Metadata.Set("kafka_timestamp", time.Date(2024, 3, 1, 12, 0, i, 0, time.UTC).Format(time.RFC3339Nano))
			}
			orders = append(orders, m)
		}
		unkeyable := dlqtest.Order(10)
		unkeyable.Payload = []byte(`{"customer_id": 3}`)
		reason := framework.Permanent(errors.New("undecodable after the deploy"))
		copies := w.Poisoned(consumer, keySpec, reason, append(orders, unkeyable)...)
		copies = append(copies, w.Poisoned("analytics", keySpec, reason, dlqtest.Order(11))...)
		w.Publish(w.Poison, copies...)

		w.Claim(consumer, "order:1", dlq.Fingerprint(orders[0].Payload))
		w.Claim(consumer, "order:2", dlq.Fingerprint(orders[1].Payload))
		w.Claim(consumer, "order:3", dlq.Fingerprint([]byte(`{"order_id": 3, "something": "else"}`)))
		w.Claim(consumer, "order:4", nil)
		w.Claim("analytics", "order:5", nil) // another consumer's claim does not count

		type row struct {
			class  dlq.Class
			match  dlq.Match
			action dlq.Action
		}
		want := map[string]row{
			"order-1":  {dlq.ClassApplied, dlq.MatchSame, dlq.ActionPass},
			"order-2":  {dlq.ClassApplied, dlq.MatchSame, dlq.ActionPass},
			"order-3":  {dlq.ClassApplied, dlq.MatchDifferent, dlq.ActionPass},
			"order-4":  {dlq.ClassApplied, dlq.MatchUnrecorded, dlq.ActionPass},
			"order-5":  {dlq.ClassWouldApply, "", dlq.ActionReplay},
			"order-6":  {dlq.ClassWouldApply, "", dlq.ActionReplay},
			"order-7":  {dlq.ClassWouldApply, "", dlq.ActionReplay},
			"order-8":  {dlq.ClassWouldApply, "", dlq.ActionReplay},
			"order-9":  {dlq.ClassWouldApply, "", dlq.ActionReplay},
			"order-10": {dlq.ClassStillBad, "", dlq.ActionKeep},
			"order-11": {"", "", dlq.ActionPass}, // analytics' copy
		}
		run := func(dry, resume bool) (dlq.Totals, map[string]row) {
			got := map[string]row{}
			r := dlq.Run{Source: open(t, w, resume), Classifier: classifier(t, w.Pool, w.Schema), Topic: w.Topic,
				Filter: dlq.Filter{Consumer: consumer, Topic: w.Topic}, DryRun: dry, BatchSize: 4,
				OnLetter: func(l *dlq.Letter) error {
					got[l.Msg.UUID] = row{l.Class, l.Match, l.Action}
					require.Equal(t, !dry && l.Action == dlq.ActionReplay, l.Replayed, l.Position)
					return nil
				}}
			tot, err := r.Replay(ctx)
			require.NoError(t, err)
			require.NoError(t, r.Source.Close())
			return tot, got
		}

		before := uuids(w.Read(w.Poison))
		tot, got := run(true, true)
		require.Equal(t, want, got)
		require.Equal(t, dlq.Totals{Seen: 11, Selected: 10, OtherConsumer: 1, Applied: 4, AppliedDifferent: 1, WouldApply: 5, StillBad: 1}, tot)
		require.Equal(t, before, uuids(w.Read(w.Poison)), "a dry run changes nothing")
		require.Zero(t, w.Depth(w.Topic))

		tot, got = run(false, true)
		require.Equal(t, want, got)
		require.EqualValues(t, 5, tot.Replayed)
		replayed := w.Read(w.Topic)
		require.ElementsMatch(t, []string{"order-5", "order-6", "order-7", "order-8", "order-9"}, uuids(replayed))
		for _, m := range replayed {
			id := dlqtest.OrderID(m)
			orig := orders[id-1]
			require.Equal(t, []byte(orig.Payload), []byte(m.Payload))
			for _, k := range []string{"event_id", "traceparent", "partition_key"} {
				require.Equal(t, orig.Metadata.Get(k), m.Metadata.Get(k), k)
			}
			for k := range m.Metadata {
				require.NotContains(t, k, "poison", "poison bookkeeping left on the replayed copy")
			}
			if w.Kind == brokers.KindKafka {
				require.Equal(t, orig.Metadata.Get("kafka_timestamp"), m.Metadata.Get("kafka_timestamp"), "record timestamp kept")
				require.Equal(t, fmt.Sprint(id), m.Metadata.Get("kafka_key"), "record key kept")
			}
		}

		switch w.Kind {
		case brokers.KindAMQP, brokers.KindNATS:
			// The replayed ones are gone; the rest is still there, in order.
			require.Equal(t, []string{"order-1", "order-2", "order-3", "order-4", "order-10", "order-11"}, uuids(w.Read(w.Poison)))
		case brokers.KindKafka:
			// Progress: past 1-9 (passed over or replayed), stopped at
			// the still-bad order 10 (offset 9).
			require.Equal(t, map[int32]int64{0: 9}, w.Committed(dlq.ProgressGroup(consumer), w.Poison))
			require.Len(t, w.Read(w.Poison), 11, "a topic keeps its records")
		}

		// Again: nothing would apply any more. On Kafka the replay
		// resumes at the still-bad one.
		tot, _ = run(false, true)
		require.Zero(t, tot.Replayed)
		require.Zero(t, tot.WouldApply)
		require.Len(t, w.Read(w.Topic), 5, "nothing republished twice")
		if w.Kind == brokers.KindKafka {
			require.EqualValues(t, 2, tot.Seen, "resumed after the progress")
			// From the start it sees them all again; the five are not
			// applied yet (no consumer ran), so they would apply.
			tot, _ = run(true, false)
			require.EqualValues(t, 11, tot.Seen)
			require.EqualValues(t, 5, tot.WouldApply)
		}
	})
}

// --include-applied replays already applied letters too; filters select
// by reason, key and age, and --limit stops early; what is left out stays.
func TestReplaySelection(t *testing.T) {
	dlqtest.EachBroker(t, 1, func(t *testing.T, w *dlqtest.World) {
		ctx := context.Background()
		var copies []*message.Message
		for i := 1; i <= 6; i++ {
			reason := errors.New("handler timeout")
			if i%2 == 0 {
				reason = errors.New("constraint violation")
			}
			copies = append(copies, w.Poisoned(consumer, keySpec, reason, dlqtest.Order(i))...)
		}
		copies[0].Metadata.Set("claimtx_poisoned_at", time.Now().Add(-10*24*time.Hour).UTC().Format(time.RFC3339Nano))
		w.Publish(w.Poison, copies...)
		w.Claim(consumer, "order:2", nil)

		browse := func(f dlq.Filter, limit int64) []string {
			var got []string
			r := dlq.Run{Source: open(t, w, false), Classifier: classifier(t, w.Pool, w.Schema), Filter: f, Limit: limit,
				OnLetter: func(l *dlq.Letter) error { got = append(got, l.Msg.UUID); return nil }}
			_, err := r.Browse(ctx)
			require.NoError(t, err)
			require.NoError(t, r.Source.Close())
			return got
		}
		require.Equal(t, []string{"order-2", "order-4", "order-6"}, browse(dlq.Filter{Reason: "constraint"}, 0))
		require.Equal(t, []string{"order-5"}, browse(dlq.Filter{Key: "order:5"}, 0))
		require.Equal(t, []string{"order-1"}, browse(dlq.Filter{OlderThan: 7 * 24 * time.Hour}, 0))
		require.Len(t, browse(dlq.Filter{NewerThan: 7 * 24 * time.Hour}, 0), 5)
		require.Equal(t, []string{"order-1", "order-2"}, browse(dlq.Filter{}, 2))
		require.Equal(t, []string{"order-2", "order-5"}, browse(dlq.Filter{IDs: []string{"order-5", "order-2", "order-99"}}, 0))
		require.Equal(t, []string{"order-4"}, browse(dlq.Filter{IDs: []string{"order-4", "order-5"}, Reason: "constraint"}, 0), "with the other filters")

		// Replay the even ones, applied one included.
		r := dlq.Run{Source: open(t, w, true), Classifier: classifier(t, w.Pool, w.Schema), Topic: w.Topic,
			Filter: dlq.Filter{Reason: "constraint"}, IncludeApplied: true}
		tot, err := r.Replay(ctx)
		require.NoError(t, err)
		require.NoError(t, r.Source.Close())
		require.EqualValues(t, 3, tot.Replayed)
		require.ElementsMatch(t, []string{"order-2", "order-4", "order-6"}, uuids(w.Read(w.Topic)))
		if w.Kind != brokers.KindKafka {
			require.Equal(t, []string{"order-1", "order-3", "order-5"}, uuids(w.Read(w.Poison)))
		} else {
			// order-1 (offset 0) was filtered out: no progress at all,
			// so a later run without the filter sees everything.
			require.Empty(t, w.Committed(dlq.ProgressGroup(consumer), w.Poison))
		}
	})
}

// A destination or original topic that does not exist is named, never
// created.
func TestMissingDestination(t *testing.T) {
	dlqtest.EachBroker(t, 1, func(t *testing.T, w *dlqtest.World) {
		_, err := dlq.Open(context.Background(), w.Broker, dlq.Options{Destination: w.Topic + ".nope"})
		require.ErrorContains(t, err, "does not exist")
		require.Zero(t, w.Depth(w.Topic+".nope"))

		// A copy naming a topic that is gone: the replay says so and
		// the copy stays.
		cp := w.Poisoned(consumer, keySpec, errors.New("x"), dlqtest.Order(1))
		cp[0].Metadata.Set("topic_poisoned", w.Topic+".gone")
		w.Publish(w.Poison, cp...)
		r := dlq.Run{Source: open(t, w, true), Classifier: classifier(t, w.Pool, w.Schema), Topic: w.Topic}
		_, err = r.Replay(context.Background())
		require.ErrorContains(t, err, fmt.Sprintf("%q does not exist", w.Topic+".gone"))
		require.NoError(t, r.Source.Close())
		require.Equal(t, []string{"order-1"}, uuids(w.Read(w.Poison)))
		require.Zero(t, w.Depth(w.Topic+".gone"), "not created")
		if w.Kind == brokers.KindKafka {
			require.Empty(t, w.Committed(dlq.ProgressGroup(consumer), w.Poison))
		}
	})
}

// A kind without dead-letter browsing is named as the user set it: BROKER
// when it came from the environment.
func TestOpenUnsupportedKind(t *testing.T) {
	cfg := brokers.Config{Kind: brokers.KindGoChannel}
	_, err := dlq.Open(context.Background(), cfg, dlq.Options{Destination: "x.poison"})
	require.EqualError(t, err, `claimtx: config field "kind": "gochannel": dead letters can be browsed on amqp, kafka and nats only`)

	t.Setenv("BROKER", brokers.KindGoChannel)
	cfg, err = brokers.LoadConfig("")
	require.NoError(t, err)
	_, err = dlq.Open(context.Background(), cfg, dlq.Options{Destination: "x.poison"})
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "BROKER", ce.Field)
}

// A consumer killed after poisoning a message and before its ack poisons
// it again when the broker redelivers it (the documented at-least-once
// poisoning): the destination holds two copies of one message. Browse
// marks the later copy, the classes count each message once, and a
// replay sends each message once. A message with the same key and
// another payload is not a copy.
func TestRepeatedCopiesReplayedOnce(t *testing.T) {
	dlqtest.EachBroker(t, 1, func(t *testing.T, w *dlqtest.World) {
		ctx := context.Background()
		reason := errors.New("cannot decode")
		copies := w.Poisoned(consumer, keySpec, reason, dlqtest.Orders(1, 3)...)
		copies = append(copies, w.Poisoned(consumer, keySpec, reason, dlqtest.Order(1), dlqtest.Order(2))...)
		other := dlqtest.Order(3)
		other.UUID, other.Payload = "order-3-other", []byte(`{"order_id": 3, "note": "another payload"}`)
		copies = append(copies, w.Poisoned(consumer, keySpec, reason, other)...)
		w.Publish(w.Poison, copies...)

		copyOf := map[string]string{} // position -> CopyOf
		var positions []string
		r := dlq.Run{Source: open(t, w, false), Classifier: classifier(t, w.Pool, w.Schema),
			OnLetter: func(l *dlq.Letter) error {
				positions = append(positions, l.Position)
				copyOf[l.Position] = l.CopyOf
				return nil
			}}
		tot, err := r.Browse(ctx)
		require.NoError(t, err)
		require.NoError(t, r.Source.Close())
		require.Len(t, positions, 6)
		require.EqualValues(t, 6, tot.Selected)
		require.EqualValues(t, 2, tot.Repeated)
		require.EqualValues(t, 4, tot.WouldApply, "each message once")
		require.Equal(t, []string{"", "", "", positions[0], positions[1], ""}, []string{
			copyOf[positions[0]], copyOf[positions[1]], copyOf[positions[2]], copyOf[positions[3]], copyOf[positions[4]], copyOf[positions[5]]})

		r = dlq.Run{Source: open(t, w, true), Classifier: classifier(t, w.Pool, w.Schema), Topic: w.Topic}
		tot, err = r.Replay(ctx)
		require.NoError(t, err)
		require.NoError(t, r.Source.Close())
		require.EqualValues(t, 4, tot.Replayed)
		require.ElementsMatch(t, []string{"order-1", "order-2", "order-3", "order-3-other"}, uuids(w.Read(w.Topic)))
	})
}
