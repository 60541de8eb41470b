package nats_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	natsgo "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/nats" // registers the kind
	"github.com/claimtx/claimtx/internal/testenv"
)

// These tests use only what a user of the module can: the public brokers
// API and this package's. The local NATS server (JetStream enabled) is
// shared; every test isolates itself by subject, stream and durable names.

func natsURL() string {
	if u := os.Getenv("TEST_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// requireNATS skips the test when no NATS listens, or fails it under CI
// (CI=true), where the server is part of the machine.
func requireNATS(t *testing.T) {
	t.Helper()
	host := strings.TrimPrefix(natsURL(), "nats://")
	c, err := net.DialTimeout("tcp", host, time.Second)
	if err == nil {
		_ = c.Close()
		return
	}
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatalf("NATS is not reachable at %s under CI: %v", host, err)
	}
	t.Skipf("NATS is not reachable at %s: %v", host, err)
}

var unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9_-]+`)

// uniqueName is a topic/durable name unique to this test and run.
func uniqueName(t *testing.T) string { return testenv.UniqueName(t, 60) }

// config is a nats Config for the local server with short timings; opts
// are "key=value" settings on top, keys as in the nats: section of a file.
func config(opts ...string) brokers.Config {
	settings := map[string]string{"url": natsURL(), "ack_wait": "2s", "nack_delay": "-1s", "dial_timeout": "5s"}
	for _, kv := range opts {
		k, v, _ := strings.Cut(kv, "=")
		settings[k] = v
	}
	var data bytes.Buffer
	for k, v := range settings {
		fmt.Fprintf(&data, "%s: %s\n", k, v)
	}
	c := brokers.Config{Kind: brokers.KindNATS}
	dec := yaml.NewDecoder(&data)
	dec.KnownFields(true)
	if err := dec.Decode(&c.NATS); err != nil {
		panic(fmt.Sprintf("nats test config %v: %v", opts, err))
	}
	return c
}

func newPublisher(t *testing.T, cfg brokers.Config) message.Publisher {
	t.Helper()
	pub, err := brokers.NewPublisher(cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func newSubscriber(t *testing.T, cfg brokers.Config) message.Subscriber {
	t.Helper()
	sub, err := brokers.NewSubscriber(cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// subscribe subscribes a subscriber of its own, built from cfg, to topic
// for the rest of the test.
func subscribe(t *testing.T, cfg brokers.Config, topic string) <-chan *message.Message {
	t.Helper()
	msgs, err := newSubscriber(t, cfg).Subscribe(t.Context(), topic)
	require.NoError(t, err)
	return msgs
}

// subscribeAfter publishes msgs to topic, then subscribes to it with cfg:
// the messages wait in the stream for a subscriber that is not there yet.
func subscribeAfter(t *testing.T, cfg brokers.Config, topic string, msgs ...*message.Message) <-chan *message.Message {
	t.Helper()
	require.NoError(t, newPublisher(t, cfg).Publish(topic, msgs...))
	return subscribe(t, cfg, topic)
}

// rawJS is a plain nats.go JetStream client, as an operator or a
// non-Watermill producer has. It deletes, when the test ends, every stream
// whose name starts with one of prefixes.
func rawJS(t *testing.T, prefixes ...string) natsgo.JetStreamContext {
	t.Helper()
	nc, err := natsgo.Connect(natsURL())
	require.NoError(t, err)
	js, err := nc.JetStream()
	require.NoError(t, err)
	t.Cleanup(func() {
		defer nc.Close()
		deleteStreams(js, prefixes...)
	})
	return js
}

// isolated is what most tests start with: it requires NATS, and returns
// a name of the test's own and a raw JetStream client that deletes the
// streams named after it when the test ends.
func isolated(t *testing.T) (string, natsgo.JetStreamContext) {
	t.Helper()
	requireNATS(t)
	name := uniqueName(t)
	return name, rawJS(t, name)
}

func deleteStreams(js natsgo.JetStreamContext, prefixes ...string) {
	for name := range js.StreamNames() {
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				_ = js.DeleteStream(name)
			}
		}
	}
}

// publishN publishes n messages, UUIDs "0" to n-1, to topic.
func publishN(t *testing.T, pub message.Publisher, topic string, n int) {
	t.Helper()
	for i := range n {
		require.NoError(t, pub.Publish(topic, message.NewMessage(fmt.Sprint(i), nil)))
	}
}

// tally counts the deliveries of each message (by UUID) that handlers on
// several goroutines see.
type tally struct {
	mu   sync.Mutex
	seen map[string]int
}

func (c *tally) add(m *message.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = map[string]int{}
	}
	c.seen[m.UUID]++
}

func (c *tally) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

// requireEachOnce requires n messages, each delivered exactly once.
func (c *tally) requireEachOnce(t *testing.T, n int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Len(t, c.seen, n)
	for id, k := range c.seen {
		require.Equal(t, 1, k, "message %s", id)
	}
}

// deliverRaw publishes nm with the raw client js, as a producer that
// knows nothing of Watermill, once sub has provisioned its subject, and
// returns JetStream's acknowledgement and the message sub receives.
func deliverRaw(t *testing.T, js natsgo.JetStreamContext, sub message.Subscriber, nm *natsgo.Msg) (*natsgo.PubAck, *message.Message) {
	t.Helper()
	require.NoError(t, sub.(message.SubscribeInitializer).SubscribeInitialize(nm.Subject))
	ack, err := js.PublishMsg(nm)
	require.NoError(t, err)
	msgs, err := sub.Subscribe(t.Context(), nm.Subject)
	require.NoError(t, err)
	return ack, receive(t, msgs, 10*time.Second)
}

// receive waits for one message or fails the test.
func receive(t *testing.T, ch <-chan *message.Message, timeout time.Duration) *message.Message {
	t.Helper()
	return testenv.Receive(t, ch, timeout)
}

func requireNothing(t *testing.T, msgs <-chan *message.Message, d time.Duration, why string) {
	t.Helper()
	select {
	case m := <-msgs:
		require.FailNow(t, "unexpected message", "%s: got %s %q", why, m.UUID, m.Payload)
	case <-time.After(d):
	}
}
