package nats_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
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

func deleteStreams(js natsgo.JetStreamContext, prefixes ...string) {
	for name := range js.StreamNames() {
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				_ = js.DeleteStream(name)
			}
		}
	}
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
