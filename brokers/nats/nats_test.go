package nats_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/observe"
	"github.com/claimtx/claimtx/internal/testenv"
)

// TestProvisioning: Subscribe creates a stream per subject (named after
// it) and a durable pull consumer with explicit acks, the configured ack
// wait and, by default, unlimited deliveries (MaxDeliver -1: JetStream
// would otherwise stop redelivering a message silently, before claimtx's
// poison path could act). Publishing to TOPIC.poison creates a stream of
// its own. Subscribing again with other limits updates the consumer.
func TestProvisioning(t *testing.T) {
	t.Parallel()
	topic, js := isolated(t)
	cfg := config("durable=svc", "ack_wait=7s")

	sub := newSubscriber(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	_, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	info, err := js.ConsumerInfo(topic, "svc")
	require.NoError(t, err)
	require.Equal(t, natsgo.AckExplicitPolicy, info.Config.AckPolicy)
	require.Equal(t, 7*time.Second, info.Config.AckWait)
	require.Equal(t, -1, info.Config.MaxDeliver)
	require.Equal(t, 256, info.Config.MaxAckPending)
	require.Equal(t, topic, info.Config.FilterSubject)
	require.Empty(t, info.Config.DeliverSubject, "a pull consumer")
	require.Equal(t, natsgo.DeliverAllPolicy, info.Config.DeliverPolicy)
	si, err := js.StreamInfo(topic)
	require.NoError(t, err)
	require.Equal(t, []string{topic}, si.Config.Subjects)
	require.Equal(t, natsgo.LimitsPolicy, si.Config.Retention)
	require.Equal(t, natsgo.FileStorage, si.Config.Storage)
	cancel()

	pub := newPublisher(t, cfg)
	require.NoError(t, pub.Publish(topic+".poison", message.NewMessage("p-1", []byte("x"))))
	name, err := js.StreamNameBySubject(topic + ".poison")
	require.NoError(t, err)
	require.Equal(t, topic+"_poison", name, "the poison topic has a stream of its own")

	sub2 := newSubscriber(t, config("durable=svc", "ack_wait=3s", "max_deliver=50", "max_ack_pending=8"))
	require.NoError(t, sub2.(message.SubscribeInitializer).SubscribeInitialize(topic))
	info, err = js.ConsumerInfo(topic, "svc")
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, info.Config.AckWait)
	require.Equal(t, 50, info.Config.MaxDeliver)
	require.Equal(t, 8, info.Config.MaxAckPending)
}

// TestMaxDeliverGivesUpSilently shows why max_deliver defaults to -1:
// with a limit, JetStream stops redelivering a message once it was
// delivered that often, and nothing is left to consume or to dead-letter:
// the consumer has nothing pending or unacked while the stream still holds
// the message. claimtx's redeliveries (nacks in an outage, crashes,
// shutdowns) say nothing about the message, so that would lose it.
func TestMaxDeliverGivesUpSilently(t *testing.T) {
	t.Parallel()
	topic, js := isolated(t)
	cfg := config("durable=svc", "concurrency=1", "max_deliver=2")
	msgs := subscribeAfter(t, cfg, topic, message.NewMessage("m", []byte("x")))
	receive(t, msgs, 10*time.Second).Nack()
	again := receive(t, msgs, 10*time.Second)
	require.Equal(t, "2", again.Metadata.Get("nats_delivered"))
	again.Nack()
	requireNothing(t, msgs, 2*time.Second, "max_deliver reached: JetStream does not deliver it again")
	ci, err := js.ConsumerInfo(topic, "svc")
	require.NoError(t, err)
	require.Zero(t, ci.NumPending, "nothing left to deliver")
	require.Zero(t, ci.NumAckPending, "nothing unacked")
	si, err := js.StreamInfo(topic)
	require.NoError(t, err)
	require.Equal(t, uint64(1), si.State.Msgs, "the stream still holds the message")
}

// TestNackDelay: a nacked message comes back (NakWithDelay), not before
// nack_delay, as delivery 2; the subscription takes other messages
// meanwhile.
func TestNackDelay(t *testing.T) {
	t.Parallel()
	const delay = 700 * time.Millisecond
	topic, _ := isolated(t)
	cfg := config("durable=svc", "concurrency=1", "nack_delay="+delay.String())
	msgs := subscribeAfter(t, cfg, topic, message.NewMessage("m-1", []byte("1")), message.NewMessage("m-2", []byte("2")))
	first := receive(t, msgs, 10*time.Second)
	require.Equal(t, "m-1", first.UUID)
	require.Equal(t, "1", first.Metadata.Get("nats_delivered"))
	nackedAt := time.Now()
	first.Nack()
	second := receive(t, msgs, 10*time.Second)
	require.Equal(t, "m-2", second.UUID, "the delay does not hold the subscription")
	second.Ack()
	again := receive(t, msgs, 10*time.Second)
	require.GreaterOrEqual(t, time.Since(nackedAt), delay)
	require.Equal(t, "m-1", again.UUID)
	require.Equal(t, "2", again.Metadata.Get("nats_delivered"))
	again.Ack()
}

// TestCloseHandsBack: messages received and not acked when the subscriber
// closes are nacked at once, so another subscriber gets them without
// waiting for the (here long) ack wait; nothing is acked that the handler
// did not ack.
func TestCloseHandsBack(t *testing.T) {
	t.Parallel()
	topic, _ := isolated(t)
	cfg := config("durable=svc", "concurrency=2", "ack_wait=60s")
	pub := newPublisher(t, cfg)
	require.NoError(t, pub.Publish(topic, message.NewMessage("a", []byte("a")), message.NewMessage("b", []byte("b"))))

	sub1, err := brokers.NewSubscriber(cfg, nil)
	require.NoError(t, err)
	msgs1, err := sub1.Subscribe(t.Context(), topic)
	require.NoError(t, err)
	receive(t, msgs1, 10*time.Second) // held, never acked
	require.NoError(t, sub1.Close())
	_, open := <-msgs1
	require.False(t, open, "Close closes the channel")

	msgs2 := subscribe(t, cfg, topic)
	got := map[string]bool{}
	for range 2 {
		m := receive(t, msgs2, 10*time.Second) // well within ack_wait
		got[m.UUID] = true
		m.Ack()
	}
	require.Equal(t, map[string]bool{"a": true, "b": true}, got)
}

// TestLongHandlerNotRedelivered: while the router works on a message, the
// subscriber tells JetStream it is in progress, so a handler slower than
// the ack wait does not get a twin delivered beside it.
func TestLongHandlerNotRedelivered(t *testing.T) {
	t.Parallel()
	topic, _ := isolated(t)
	cfg := config("durable=svc", "concurrency=2", "ack_wait=1s")
	msgs := subscribeAfter(t, cfg, topic, message.NewMessage("slow", []byte("x")))
	m := receive(t, msgs, 10*time.Second)
	requireNothing(t, msgs, 3500*time.Millisecond, "the message is in progress for 3.5 ack waits")
	m.Ack()
	requireNothing(t, msgs, 1500*time.Millisecond, "acked")
}

// TestBacklogBehindSlowHandlersNotRedelivered: with a backlog and every
// worker busy for longer than the ack wait, no message is delivered twice:
// a worker pulls a message only when it is free, so none waits in a
// client buffer while its ack wait runs out.
func TestBacklogBehindSlowHandlersNotRedelivered(t *testing.T) {
	t.Parallel()
	topic, _ := isolated(t)
	const n = 6
	cfg := config("durable=svc", "concurrency=2", "ack_wait=1s")
	publishN(t, newPublisher(t, cfg), topic, n)
	msgs := subscribe(t, cfg, topic)
	var seen tally
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n / 2 {
				var m *message.Message
				select {
				case m = <-msgs:
				case <-time.After(10 * time.Second):
					assert.Fail(t, "no message within 10s")
					return
				}
				seen.add(m)
				assert.Equal(t, "1", m.Metadata.Get("nats_delivered"), "message %s", m.UUID)
				time.Sleep(1200 * time.Millisecond) // the handler's work, longer than the ack wait
				m.Ack()
			}
		}()
	}
	wg.Wait()
	requireNothing(t, msgs, 1500*time.Millisecond, "every message was acked once")
	seen.requireEachOnce(t, n)
}

// TestReplicasShareTheDurable: two subscribers (two replicas of a
// service) with one durable split the messages: each is processed once.
// A third with another durable (another service) sees them all.
func TestReplicasShareTheDurable(t *testing.T) {
	t.Parallel()
	topic, _ := isolated(t)
	const n = 40
	cfg := config("durable=svc", "concurrency=2")
	a := subscribe(t, cfg, topic)
	b := subscribe(t, cfg, topic)
	other := subscribe(t, config("durable=other"), topic)
	publishN(t, newPublisher(t, cfg), topic, n)
	var seen tally
	var wg sync.WaitGroup
	for _, ch := range []<-chan *message.Message{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range ch {
				seen.add(m)
				m.Ack()
			}
		}()
	}
	require.Eventually(t, func() bool { return seen.len() == n }, 20*time.Second, 10*time.Millisecond)
	for range n {
		receive(t, other, 10*time.Second).Ack()
	}
	requireNothing(t, a, 500*time.Millisecond, "every message was acked once")
	seen.requireEachOnce(t, n)
}

// TestPlainProducer: a producer that knows nothing of Watermill publishes
// with nats.go, an event_id header and a header with two values. The
// message arrives with its headers as metadata (the two values joined),
// the delivery described in nats_* metadata, and the producer's
// Nats-Msg-Id as its UUID.
func TestPlainProducer(t *testing.T) {
	t.Parallel()
	topic, js := isolated(t)
	nm := natsgo.NewMsg(topic)
	nm.Data = []byte(`{"order_id": 1}`)
	nm.Header.Set("event_id", "evt-1")
	nm.Header.Add("X-Multi", "a")
	nm.Header.Add("X-Multi", "b")
	nm.Header.Set(natsgo.MsgIdHdr, "producer-id-1")
	ack, m := deliverRaw(t, js, newSubscriber(t, config("durable=svc")), nm)
	m.Ack()
	require.Equal(t, `{"order_id": 1}`, string(m.Payload))
	require.Equal(t, "producer-id-1", m.UUID)
	require.Equal(t, "evt-1", m.Metadata.Get("event_id"))
	require.Equal(t, "a, b", m.Metadata.Get("X-Multi"))
	require.Equal(t, topic, m.Metadata.Get("nats_subject"))
	require.Equal(t, ack.Stream, m.Metadata.Get("nats_stream"))
	require.Equal(t, fmt.Sprint(ack.Sequence), m.Metadata.Get("nats_sequence"))
	require.Equal(t, "1", m.Metadata.Get("nats_delivered"))
	ts, err := time.Parse(time.RFC3339Nano, m.Metadata.Get("nats_timestamp"))
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), ts, time.Minute)
}

// TestRepublishedCopy: a received message published again (what the
// poison middleware does with TOPIC.poison) keeps its UUID, payload and
// the producer's headers, not the delivery's nats_* metadata or a
// producer's Nats-Expected-* precondition (which the poison stream would
// refuse); a line break in a value (a poison reason) arrives as a space.
// A metadata key NATS cannot carry is an error, not a silent drop.
func TestRepublishedCopy(t *testing.T) {
	t.Parallel()
	topic, js := isolated(t)
	cfg := config("durable=svc")
	nm := natsgo.NewMsg(topic)
	nm.Data = []byte("payload")
	nm.Header.Set("event_id", "evt-9")
	nm.Header.Set(natsgo.ExpectedStreamHdr, topic)
	_, m := deliverRaw(t, js, newSubscriber(t, cfg), nm)
	cp := m.Copy()
	cp.Metadata.Set("claimtx_poison_reason", "line one\nline two")
	pub := newPublisher(t, cfg)
	require.NoError(t, pub.Publish(topic+".poison", cp))
	m.Ack()

	raw, err := js.GetLastMsg(topic+"_poison", topic+".poison")
	require.NoError(t, err)
	require.Equal(t, "payload", string(raw.Data))
	require.Equal(t, "evt-9", raw.Header.Get("event_id"))
	require.Equal(t, "line one line two", raw.Header.Get("claimtx_poison_reason"))
	require.Equal(t, m.UUID, raw.Header.Get("_watermill_message_uuid"))
	for k := range raw.Header {
		require.False(t, strings.HasPrefix(k, "nats_") || strings.HasPrefix(k, "Nats-Expected-"), "header %s", k)
	}

	bad := message.NewMessage(watermill.NewUUID(), nil)
	bad.Metadata.Set("has space", "x")
	err = pub.Publish(topic, bad)
	require.ErrorContains(t, err, `metadata key "has space"`)
}

// TestStreamsRequire: with streams: require nothing is created: a topic
// without a stream fails with a clear error; an operator's stream that
// captures the subject (here a wildcard under a subject prefix) is used
// as it is.
func TestStreamsRequire(t *testing.T) {
	t.Parallel()
	topic, js := isolated(t)
	cfg := config("durable=svc", "streams=require", "subject_prefix="+topic+".")
	pub := newPublisher(t, cfg)
	err := pub.Publish("orders", message.NewMessage("1", nil))
	require.ErrorContains(t, err, "no JetStream stream captures the subject")
	require.ErrorContains(t, err, topic+".orders")
	_, err = newSubscriber(t, cfg).Subscribe(t.Context(), "orders")
	require.ErrorContains(t, err, "no JetStream stream captures the subject")

	_, err = js.AddStream(&natsgo.StreamConfig{Name: topic + "-ops", Subjects: []string{topic + ".>"}})
	require.NoError(t, err)
	require.NoError(t, pub.Publish("orders", message.NewMessage("1", []byte("o"))))
	require.NoError(t, pub.Publish("orders.poison", message.NewMessage("2", []byte("p"))))
	msgs, err := newSubscriber(t, cfg).Subscribe(t.Context(), "orders")
	require.NoError(t, err)
	m := receive(t, msgs, 10*time.Second)
	require.Equal(t, "1", m.UUID)
	require.Equal(t, topic+".orders", m.Metadata.Get("nats_subject"))
	require.Equal(t, topic+"-ops", m.Metadata.Get("nats_stream"))
	m.Ack()
	requireNothing(t, msgs, 300*time.Millisecond, "the consumer filters its own subject")
}

// TestHealth: the subscriber reports its connection to
// observe.SubscriberConnected, which /healthz uses.
func TestHealth(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	sub, err := brokers.NewSubscriber(config("durable=svc"), nil)
	require.NoError(t, err)
	check := observe.SubscriberConnected(sub)
	require.NotNil(t, check)
	require.NoError(t, check(t.Context()))
	require.NoError(t, sub.Close())
	require.Error(t, check(t.Context()))
}

// TestDialGivesUp: with nothing listening, construction retries until
// dial_timeout and fails with the cause; a negative dial_timeout tries
// once.
func TestDialGivesUp(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	for _, tc := range []struct {
		timeout  string
		min, max time.Duration
	}{{"1s", 500 * time.Millisecond, 5 * time.Second}, {"-1s", 0, time.Second}} {
		start := time.Now()
		_, err = brokers.NewPublisher(config("url=nats://"+addr, "dial_timeout="+tc.timeout), nil)
		took := time.Since(start)
		require.ErrorContains(t, err, "connect to NATS")
		require.ErrorIs(t, err, natsgo.ErrNoServers)
		require.GreaterOrEqual(t, took, tc.min, tc.timeout)
		require.Less(t, took, tc.max, tc.timeout)
	}
}

// TestDurableRequiredToSubscribe: a publisher needs no durable, a
// subscriber does (no default: two services sharing one would split the
// messages), and the error names the option before anything connects.
func TestDurableRequiredToSubscribe(t *testing.T) {
	t.Parallel()
	_, err := brokers.NewSubscriber(config("url=nats://127.0.0.1:1"), nil)
	requireField(t, err, "nats.durable")
	require.ErrorContains(t, err, "required to subscribe")
}

// requireField checks err is a *framework.ConfigError naming field.
func requireField(t *testing.T, err error, field string) {
	t.Helper()
	var ce *framework.ConfigError
	require.True(t, errors.As(err, &ce), "not a ConfigError: %v", err)
	require.Equal(t, field, ce.Field, "error: %v", err)
}

// TestPublishRefusalsArePermanent: what JetStream or the server will never
// take, however often it is sent, fails with a framework.Permanent error,
// which the Poison middleware acts on (a smaller copy, then the
// dead-letter table) instead of nacking the original forever: headers
// over JetStream's 64 KiB, a message over the server's max_payload or the
// stream's max_msg_size, a metadata key no header can carry, no stream
// with streams: require. A message that fits goes through afterwards.
func TestPublishRefusalsArePermanent(t *testing.T) {
	t.Parallel()
	topic, js := isolated(t)
	cfg := config("durable=svc", "subject_prefix="+topic+".")
	pub := newPublisher(t, cfg)

	headers := message.NewMessage("h", []byte("{}"))
	headers.Metadata.Set("reason", strings.Repeat("r", 70_000))
	payload := message.NewMessage("p", make([]byte, 1<<20))
	badKey := message.NewMessage("k", []byte("{}"))
	badKey.Metadata.Set("has space", "x")
	for name, m := range map[string]*message.Message{"headers over 64 KiB": headers, "over max_payload": payload, "bad key": badKey} {
		err := pub.Publish("orders", m)
		require.Error(t, err, name)
		require.True(t, framework.IsPermanent(err), "%s: %v", name, err)
	}

	// The stream's own limit.
	_, err := js.AddStream(&natsgo.StreamConfig{Name: topic + "-small", Subjects: []string{topic + ".small"}, MaxMsgSize: 1024})
	require.NoError(t, err)
	err = pub.Publish("small", message.NewMessage("s", make([]byte, 2048)))
	require.Error(t, err)
	require.True(t, framework.IsPermanent(err), "over max_msg_size: %v", err)
	require.NoError(t, pub.Publish("small", message.NewMessage("s", make([]byte, 100))))

	err = newPublisher(t, config("durable=svc", "streams=require", "subject_prefix="+topic+".none.")).Publish("orders", message.NewMessage("n", nil))
	require.ErrorContains(t, err, "no JetStream stream captures the subject")
	require.True(t, framework.IsPermanent(err), "no stream: %v", err)

	require.NoError(t, pub.Publish("orders", message.NewMessage("ok", []byte("{}"))), "what fits goes through")
}

// TestPublishDeniedIsPermanent: a subject the user may not publish to (a
// poison subject left out of its permissions) can never be published to.
// The server says so asynchronously and the JetStream publish only times
// out waiting for its acknowledgement; the publisher recognises the
// refusal and reports it as framework.Permanent, so the Poison middleware
// dead-letters the message instead of nacking it forever. The test runs a
// NATS server of its own, with users and permissions.
func TestPublishDeniedIsPermanent(t *testing.T) {
	t.Parallel()
	server := testenv.RequireTool(t, "nats-server")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf(`
listen: %q
jetstream { store_dir: %q }
accounts {
  app {
    jetstream: enabled
    users: [ { user: svc, password: secret, permissions: { publish: { deny: ["denied.>"] } } } ]
  }
}
`, addr, filepath.Join(dir, "js"))), 0o600))
	cmd := exec.Command(server, "-c", conf)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, 15*time.Second, 20*time.Millisecond, "nats-server listens")

	cfg := config("durable=svc", "user=svc", "password=secret")
	cfg.NATS.URL = "nats://" + addr
	pub := newPublisher(t, cfg)
	err = pub.Publish("denied.poison", message.NewMessage("d", []byte("{}")))
	require.Error(t, err)
	require.True(t, framework.IsPermanent(err), "got %v", err)
	require.ErrorContains(t, err, "permissions violation")
	require.NoError(t, pub.Publish("allowed", message.NewMessage("a", []byte("{}"))), "other subjects go through")
}
