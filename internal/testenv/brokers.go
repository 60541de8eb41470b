package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
)

// CloseAtEnd returns a function that registers closers to close when t
// ends, from any goroutine. Watermill's Pub/Sub suite (pubsub/tests)
// closes some subscribers before using them and leaks the ones its
// multiplier builds afterwards, so the adapters' conformance runs close
// everything they built once the suite is done.
func CloseAtEnd(t testing.TB) func(...io.Closer) {
	var mu sync.Mutex
	var closers []io.Closer
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range closers {
			_ = c.Close()
		}
	})
	return func(cs ...io.Closer) {
		mu.Lock()
		defer mu.Unlock()
		closers = append(closers, cs...)
	}
}

// SubscribeReceive subscribes sub to topic for the rest of t and waits for
// the first message (see Receive); the channel gives the ones after it.
func SubscribeReceive(t testing.TB, sub message.Subscriber, topic string, timeout time.Duration) (*message.Message, <-chan *message.Message) {
	t.Helper()
	msgs, err := sub.Subscribe(t.Context(), topic)
	require.NoError(t, err)
	return Receive(t, msgs, timeout), msgs
}

// Receive waits for one message from a subscription or fails the test; a
// closed channel fails it too, since the tests that wait expect a message.
func Receive(t testing.TB, ch <-chan *message.Message, timeout time.Duration) *message.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		require.True(t, ok, "messages channel closed")
		return m
	case <-time.After(timeout):
		t.Fatalf("no message within %s", timeout)
		return nil
	}
}

var unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9_-]+`)

// UniqueName is a queue, topic, group or durable name unique to this test
// and run, so tests run in parallel and rerun on a dirty broker. The test's
// own name is cut to its last maxName characters, as brokers bound names
// (NATS durables the tightest).
func UniqueName(t testing.TB, maxName int) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := unsafeChars.ReplaceAllString(t.Name(), "_")
	if len(name) > maxName {
		name = name[len(name)-maxName:]
	}
	return "claimtx-test-" + strings.ToLower(name) + "-" + hex.EncodeToString(b)
}
