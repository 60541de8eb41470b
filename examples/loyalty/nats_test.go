package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestNATSSIGKILLMidWorkLosesNothing: two consumers on NATS JetStream
// work through a backlog, each with claim transactions open (the handler
// holds each one 30 ms) and more messages delivered and not yet acked;
// one is SIGKILLed mid-work. JetStream redelivers what it held after the
// ack wait (NATS_ACK_WAIT=3s here), to the survivor or a replacement:
// every order credited exactly once, every message acked in the end, and
// the durable consumer the adapter created never gives up on a message
// (MaxDeliver -1).
func TestNATSSIGKILLMidWorkLosesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "nats")
	os := orders(1, 400)
	h.publish(os...)
	victim := h.start("LOYALTY_HANDLER_DELAY=30ms")
	h.start("LOYALTY_HANDLER_DELAY=30ms")
	h.waitApplied(40)

	ci, err := h.js.ConsumerInfo(h.topic, "loyalty")
	require.NoError(t, err)
	require.Equal(t, -1, ci.Config.MaxDeliver)
	require.Equal(t, 3*time.Second, ci.Config.AckWait)
	require.Empty(t, ci.Config.DeliverSubject, "a pull consumer")
	require.Positive(t, ci.NumAckPending, "messages in flight when the consumer is killed")

	victim.kill()
	h.start()
	h.waitApplied(len(os))
	h.waitFor("every message acked", func() bool { return h.natsUnsettled() == 0 })
	h.assertExact(os)
	require.Equal(t, len(os), h.count(fmt.Sprintf(`SELECT count(*) FROM %q.processed_messages`, h.schema)), "claims")
	require.Empty(t, h.natsPoison(), "nothing poisoned")
}

// TestNATSNoCredentialsInLogs: a consumer on NATS with a password in
// NATS_URL (the local server has no authentication and ignores it) logs
// at debug level, consumes, poisons, reports ready on /healthz (the
// broker check included) and stops: no log line, metric or health answer
// shows the password. An unparsable NATS_URL fails naming the variable,
// without quoting it.
func TestNATSNoCredentialsInLogs(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "nats")
	secret := "NatsPw-" + randID()
	p := h.start("NATS_URL=nats://app:"+secret+"@127.0.0.1:4222", "LOG_LEVEL=debug")
	good := orders(1, 10)
	h.publish(good...)
	h.publishRaw([]string{"bad"}, [][]byte{[]byte("not json")})
	h.waitApplied(len(good))
	h.poisoned(1)
	requireEndpointsClean(t, p, secret)
	p.stop()
	require.NoError(t, p.err)
	logs := p.out.String()
	require.Contains(t, logs, "loyalty: consuming")
	requireNoSecrets(t, "the logs", logs, secret)

	bad := h.start("NATS_URL=nats://app:"+secret+"@127.0.0.1:4222:x/", "METRICS_ADDR=off")
	require.True(t, bad.exited(30*time.Second), "a bad NATS_URL must stop the consumer")
	require.Contains(t, bad.out.String(), `field \"NATS_URL\"`)
	requireNoSecrets(t, "the error", bad.out.String(), secret)
}
