// Package dlqtest builds the worlds the dead-letter tests share: a
// consumer's topic and poison destination on a real broker (RabbitMQ, NATS
// JetStream, or an in-process Kafka-protocol broker), a claims schema, and
// poisoned copies made by the real Poison middleware.
package dlqtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/kafka" // registers the kind
	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/natsmsg"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// The suite's RabbitMQ and NATS (JetStream enabled).
const (
	AMQPURL = "amqp://guest:guest@127.0.0.1:5672/" //nolint:gosec // the local test server's stock account
	NATSURL = "nats://127.0.0.1:4222"
)

// Brokers are the kinds the dead-letter tooling supports.
var Brokers = []string{brokers.KindAMQP, brokers.KindKafka, brokers.KindNATS}

// World is one isolated consumer world.
type World struct {
	T             testing.TB
	Kind          string
	Broker        brokers.Config
	Pool          *pgxpool.Pool
	Schema        string
	Topic, Poison string // the consumer's topic and poison destination
	KafkaAddr     string // the world's own Kafka-protocol broker

	kcl  *kgo.Client
	conn *amqp091.Connection
	js   jetstream.JetStream
}

func randHex() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// New builds a world on broker kind with a migrated claims schema. On
// Kafka the topic has 3 partitions and the poison topic poisonPartitions.
func New(t testing.TB, kind string, poisonPartitions int) *World {
	t.Helper()
	pool, schema := testenv.Setup(t, 8)
	st, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, st.Migrate(context.Background()))
	w := &World{T: t, Kind: kind, Pool: pool, Schema: schema, Topic: "dlq-test-" + randHex()}
	w.Poison = w.Topic + ".poison"
	w.Broker.Kind = kind
	ctx := context.Background()
	switch kind {
	case brokers.KindKafka:
		br, err := kafkatest.Start(ctx, kafkatest.Options{Addr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		t.Cleanup(func() { _ = br.Close() })
		w.KafkaAddr = br.Addrs()[0]
		w.Broker.Kafka = brokers.KafkaConfig{Brokers: br.Addrs(), SessionTimeout: 3 * time.Second, RebalanceTimeout: 3 * time.Second,
			HeartbeatInterval: 200 * time.Millisecond, CommitInterval: 100 * time.Millisecond}
		w.kcl, err = kgo.NewClient(kgo.SeedBrokers(w.KafkaAddr), kgo.ProducerLinger(0))
		require.NoError(t, err)
		t.Cleanup(w.kcl.Close)
		adm := kadm.NewClient(w.kcl)
		_, err = adm.CreateTopic(ctx, 3, 1, nil, w.Topic)
		require.NoError(t, err)
		_, err = adm.CreateTopic(ctx, int32(poisonPartitions), 1, nil, w.Poison)
		require.NoError(t, err)
	case brokers.KindAMQP:
		w.Broker.AMQP.URL = AMQPURL
		w.conn, err = amqp091.Dial(AMQPURL)
		require.NoError(t, err)
		t.Cleanup(func() {
			for _, q := range []string{w.Topic, w.Poison} {
				if ch, err := w.conn.Channel(); err == nil {
					_, _ = ch.QueueDelete(q, false, false, false)
					_ = ch.Close()
				}
			}
			_ = w.conn.Close()
		})
		ch, err := w.conn.Channel()
		require.NoError(t, err)
		for _, q := range []string{w.Topic, w.Poison} {
			_, err = ch.QueueDeclare(q, true, false, false, false, nil)
			require.NoError(t, err)
		}
		require.NoError(t, ch.Close())
	case brokers.KindNATS:
		w.Broker.NATS.URL = NATSURL
		nc, err := natsgo.Connect(NATSURL)
		require.NoError(t, err)
		w.js, err = jetstream.New(nc)
		require.NoError(t, err)
		t.Cleanup(func() {
			// The streams of the world's subjects, the adapter's included.
			for name := range w.js.StreamNames(ctx).Name() {
				if strings.HasPrefix(name, w.Topic) {
					_ = w.js.DeleteStream(ctx, name)
				}
			}
			nc.Close()
		})
		// As the adapter creates them (brokers/nats ensureStream).
		for _, subj := range []string{w.Topic, w.Poison} {
			_, err = w.js.CreateStream(ctx, jetstream.StreamConfig{Name: strings.ReplaceAll(subj, ".", "_"), Subjects: []string{subj}, Storage: jetstream.FileStorage})
			require.NoError(t, err)
		}
	default:
		t.Fatalf("dlqtest: broker %q", kind)
	}
	return w
}

// EachBroker runs test in parallel on a New world of each kind in Brokers.
func EachBroker(t *testing.T, poisonPartitions int, test func(t *testing.T, w *World)) {
	t.Helper()
	t.Parallel()
	for _, kind := range Brokers {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			test(t, New(t, kind, poisonPartitions))
		})
	}
}

// Env is the environment of a `claimtx dlq` process in this world.
func (w *World) Env() []string {
	u, err := testenv.URLWithSearchPath(w.Schema)
	require.NoError(w.T, err)
	return []string{"BROKER=" + w.Kind, "AMQP_URL=" + AMQPURL, "KAFKA_BROKERS=" + w.KafkaAddr, "NATS_URL=" + NATSURL,
		"DATABASE_URL=" + u, "CLAIMTX_SCHEMA=" + w.Schema}
}

// Order is the test event: order id and customer, keyed by the producer's
// event_id header, carrying a traceparent. Its UUID is "order-<id>".
func Order(id int) *message.Message {
	msg := message.NewMessage("order-"+strconv.Itoa(id), fmt.Appendf(nil, `{"order_id": %d, "customer_id": %d, "total_cents": 1000}`, id, id%7))
	msg.Metadata.Set("event_id", "evt-"+strconv.Itoa(id))
	msg.Metadata.Set("partition_key", strconv.Itoa(id))
	msg.Metadata.Set("traceparent", fmt.Sprintf("00-%032x-%016x-01", id, id))
	return msg
}

// Orders returns Order(from) to Order(to), in order.
func Orders(from, to int) []*message.Message {
	out := make([]*message.Message, 0, max(0, to-from+1))
	for i := from; i <= to; i++ {
		out = append(out, Order(i))
	}
	return out
}

// OrderID reads an order's id back, -1 if it has none.
func OrderID(msg *message.Message) int {
	var o struct {
		OrderID *int `json:"order_id"`
	}
	if json.Unmarshal(msg.Payload, &o) != nil || o.OrderID == nil {
		return -1
	}
	return *o.OrderID
}

// capture keeps the Poison middleware's copies, to write them in bulk.
type capture struct{ msgs []*message.Message }

func (c *capture) Publish(_ string, msgs ...*message.Message) error {
	c.msgs = append(c.msgs, msgs...)
	return nil
}
func (*capture) Close() error { return nil }

// Poisoned returns the copies the Poison middleware of consumer, keying
// with keySpec, makes of msgs failing with reason, as they came from the
// world's topic.
func (w *World) Poisoned(consumer, keySpec string, reason error, msgs ...*message.Message) []*message.Message {
	w.T.Helper()
	key, err := framework.ParseKeySpec(keySpec)
	require.NoError(w.T, err)
	c := &capture{}
	mw, err := middleware.NewPoison(middleware.Poison{Publisher: c, Topic: w.Poison, Consumer: consumer, Key: key, SourceTopic: w.Topic})
	require.NoError(w.T, err)
	h := mw(func(*message.Message) ([]*message.Message, error) { return nil, reason })
	for _, m := range msgs {
		_, err := h(m)
		require.NoError(w.T, err)
	}
	return c.msgs
}

// Publish writes msgs to topic as claimtx's adapters would, in bulk, and
// waits for the broker's confirmation.
func (w *World) Publish(topic string, msgs ...*message.Message) {
	w.T.Helper()
	ctx := context.Background()
	switch w.Kind {
	case brokers.KindKafka:
		const chunk = 5000
		for len(msgs) > 0 {
			n := min(chunk, len(msgs))
			recs := make([]*kgo.Record, n)
			for i, m := range msgs[:n] {
				r := &kgo.Record{Topic: topic, Value: m.Payload, Headers: []kgo.RecordHeader{{Key: "_watermill_message_uuid", Value: []byte(m.UUID)}}}
				for k, v := range m.Metadata {
					if !strings.HasPrefix(k, "kafka_") {
						r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
					}
				}
				if ts, err := time.Parse(time.RFC3339Nano, m.Metadata["kafka_timestamp"]); err == nil {
					r.Timestamp = ts
				}
				if k, ok := m.Metadata["partition_key"]; ok {
					r.Key = []byte(k)
				}
				recs[i] = r
			}
			require.NoError(w.T, w.kcl.ProduceSync(ctx, recs...).FirstErr())
			msgs = msgs[n:]
		}
	case brokers.KindAMQP:
		ch, err := w.conn.Channel()
		require.NoError(w.T, err)
		defer func() { _ = ch.Close() }()
		require.NoError(w.T, ch.Confirm(false))
		var dcs []*amqp091.DeferredConfirmation
		for _, m := range msgs {
			headers := amqp091.Table{"_watermill_message_uuid": m.UUID}
			for k, v := range m.Metadata {
				headers[k] = v
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", topic, false, false, amqp091.Publishing{
				Headers: headers, MessageId: m.UUID, DeliveryMode: amqp091.Persistent, Body: m.Payload})
			require.NoError(w.T, err)
			dcs = append(dcs, dc)
			if len(dcs) == 1000 {
				awaitConfirms(w.T, dcs)
				dcs = dcs[:0]
			}
		}
		awaitConfirms(w.T, dcs)
	case brokers.KindNATS:
		var acks []jetstream.PubAckFuture
		for _, m := range msgs {
			nm := &natsgo.Msg{Subject: topic, Data: m.Payload, Header: natsgo.Header{"_watermill_message_uuid": {m.UUID}}}
			for k, v := range m.Metadata {
				if !strings.HasPrefix(k, natsmsg.MetaPrefix) {
					nm.Header.Set(k, v)
				}
			}
			f, err := w.js.PublishMsgAsync(nm)
			require.NoError(w.T, err)
			acks = append(acks, f)
		}
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				require.NoError(w.T, err)
			}
		}
	}
}

func awaitConfirms(t testing.TB, dcs []*amqp091.DeferredConfirmation) {
	for _, dc := range dcs {
		ok, err := dc.WaitContext(context.Background())
		require.NoError(t, err)
		require.True(t, ok, "RabbitMQ nacked a publish")
	}
}

// Claim records that consumer applied key, with fingerprint fp (nil: not
// recorded).
func (w *World) Claim(consumer, key string, fp []byte) {
	w.T.Helper()
	_, err := w.Pool.Exec(context.Background(),
		fmt.Sprintf("INSERT INTO %s (consumer, message_key, payload_hash) VALUES ($1, $2, $3)", pgx.Identifier{w.Schema, "processed_messages"}.Sanitize()),
		consumer, key, fp)
	require.NoError(w.T, err)
}

// Read returns every message in topic now, in order (on Kafka partition
// after partition), without consuming any.
func (w *World) Read(topic string) []*message.Message {
	w.T.Helper()
	switch w.Kind {
	case brokers.KindKafka:
		return w.readKafka(topic)
	case brokers.KindNATS:
		var out []*message.Message
		w.eachNATS(topic, func(m *jetstream.RawStreamMsg) { out = append(out, natsmsg.Message(m.Subject, m.Header, m.Data, nil)) })
		return out
	default:
		return w.readAMQP(topic)
	}
}

func (w *World) readAMQP(queue string) []*message.Message {
	ch, err := w.conn.Channel()
	require.NoError(w.T, err)
	defer func() { _ = ch.Close() }()
	var out []*message.Message
	for {
		d, ok, err := ch.Get(queue, false)
		require.NoError(w.T, err)
		if !ok {
			return out
		}
		m := message.NewMessage(fmt.Sprint(d.Headers["_watermill_message_uuid"]), d.Body)
		for k, v := range d.Headers {
			if s, ok := v.(string); ok && k != "_watermill_message_uuid" {
				m.Metadata[k] = s
			}
		}
		out = append(out, m)
	}
}

func (w *World) readKafka(topic string) []*message.Message {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	starts, ends := w.offsets(ctx, topic)
	want, from := map[int32]int64{}, map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		if s, _ := starts.Lookup(topic, o.Partition); o.Offset > s.Offset {
			want[o.Partition], from[o.Partition] = o.Offset, kgo.NewOffset().At(s.Offset)
		}
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(w.KafkaAddr), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(w.T, err)
	defer cl.Close()
	byPart := map[int32][]*message.Message{}
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		require.NoError(w.T, ctx.Err(), "reading %s", topic)
		fs.EachRecord(func(r *kgo.Record) {
			end, ok := want[r.Partition]
			if !ok || r.Offset >= end {
				return
			}
			m := message.NewMessage("", r.Value)
			for _, h := range r.Headers {
				if h.Key == "_watermill_message_uuid" {
					m.UUID = string(h.Value)
				} else {
					m.Metadata[h.Key] = string(h.Value)
				}
			}
			m.Metadata["kafka_key"] = string(r.Key)
			m.Metadata["kafka_timestamp"] = r.Timestamp.UTC().Format(time.RFC3339Nano)
			m.Metadata["kafka_partition"] = strconv.Itoa(int(r.Partition))
			byPart[r.Partition] = append(byPart[r.Partition], m)
			if r.Offset+1 >= end {
				delete(want, r.Partition)
			}
		})
	}
	var out []*message.Message
	for p := int32(0); p < int32(len(ends[topic])); p++ {
		out = append(out, byPart[p]...)
	}
	return out
}

func (w *World) offsets(ctx context.Context, topic string) (starts, ends kadm.ListedOffsets) {
	adm := kadm.NewClient(w.kcl)
	starts, err := adm.ListStartOffsets(ctx, topic)
	require.NoError(w.T, err)
	ends, err = adm.ListEndOffsets(ctx, topic)
	require.NoError(w.T, err)
	return starts, ends
}

// eachNATS calls f with every message of subject topic, in order.
func (w *World) eachNATS(topic string, f func(*jetstream.RawStreamMsg)) {
	ctx := context.Background()
	name, err := w.js.StreamNameBySubject(ctx, topic)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return
	}
	require.NoError(w.T, err)
	st, err := w.js.Stream(ctx, name)
	require.NoError(w.T, err)
	for seq := uint64(1); ; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(topic))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return
		}
		require.NoError(w.T, err)
		f(m)
		seq = m.Sequence + 1
	}
}

// Depth is the number of messages in topic (RabbitMQ: ready; Kafka: end
// minus start offsets; NATS: stored).
func (w *World) Depth(topic string) int {
	w.T.Helper()
	switch w.Kind {
	case brokers.KindNATS:
		n := 0
		w.eachNATS(topic, func(*jetstream.RawStreamMsg) { n++ })
		return n
	case brokers.KindAMQP:
		return testenv.QueueDepth(w.T, w.conn, topic)
	}
	starts, ends := w.offsets(context.Background(), topic)
	n := 0
	ends.Each(func(o kadm.ListedOffset) {
		s, _ := starts.Lookup(topic, o.Partition)
		n += int(o.Offset - s.Offset)
	})
	return n
}

// Committed returns the offsets committed for group on topic.
func (w *World) Committed(group, topic string) map[int32]int64 {
	w.T.Helper()
	resps, err := kadm.NewClient(w.kcl).FetchOffsetsForTopics(context.Background(), group, topic)
	out := map[int32]int64{}
	if errors.Is(err, kerr.GroupIDNotFound) {
		return out
	}
	require.NoError(w.T, err)
	resps.Each(func(r kadm.OffsetResponse) {
		if r.Err == nil && r.At >= 0 {
			out[r.Partition] = r.At
		}
	})
	return out
}
