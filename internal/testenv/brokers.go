package testenv

import (
	"io"
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
