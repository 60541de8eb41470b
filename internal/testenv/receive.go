package testenv

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
)

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
