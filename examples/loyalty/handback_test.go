package main

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestGracefulHandBackIsNotAnError (issue 26 part 3, item 3): at shutdown
// the messages that arrive after the drain began are handed back to the
// broker unprocessed. That is a rolling deploy doing what it should, so
// it is logged at DEBUG, never as a handler ERROR (Watermill's router
// logged "Handler returned error … message handed back to the broker" for
// each one).
//
// Order 1 holds its claim transaction for 3 s (fault injection) on one of
// four subscriptions; the other three keep taking orders from a backlog,
// so when SIGTERM comes while order 1 is held, each of them receives a
// message after the drain began: held, then handed back.
func TestGracefulHandBackIsNotAnError(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "amqp")
	h.publish(orders(1, 3000)...)
	p := h.start("LOG_LEVEL=debug", "LOYALTY_HANDLER_DELAY=3s", "LOYALTY_HANDLER_DELAY_ORDER=1", "CONCURRENCY=4")
	p.waitLog(t, "holding the claim transaction open")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.True(t, p.exited(30*time.Second), "the consumer exits after SIGTERM")
	require.NoError(t, p.err, "SIGTERM ends the consumer cleanly")
	out := p.out.String()
	require.Equal(t, 1, h.count("SELECT count(*) FROM point_ledger WHERE order_id = 1"), "the held order committed during the drain")
	require.Positive(t, countLines(out, "level=DEBUG", "handed back to the broker"),
		"messages were handed back at shutdown (logged at debug):\n%s", tail(out))
	require.Zero(t, countLines(out, "level=ERROR"), "a graceful shutdown logs no error:\n%s", tail(out))
}
