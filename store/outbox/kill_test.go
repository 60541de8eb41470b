package outbox_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/amqp" // registers the kind
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/store"
	"github.com/claimtx/claimtx/store/outbox"
)

// Environment of the relay subprocess.
const (
	relayProcessEnv = "CLAIMTX_TEST_RELAY_PROCESS"
	relaySchemaEnv  = "CLAIMTX_TEST_RELAY_SCHEMA"
)

// amqpBrokers is the RabbitMQ configuration of the kill test. Its queues
// expire a minute after last use, so reruns leave nothing behind.
func amqpBrokers() brokers.Config {
	url := os.Getenv("TEST_AMQP_URL")
	return brokers.Config{Kind: brokers.KindAMQP, AMQP: brokers.AMQPConfig{
		URL:            url,
		Concurrency:    1,
		NackDelay:      -1,
		DialTimeout:    10 * time.Second,
		QueueArguments: map[string]any{"x-expires": int32(60_000)},
		ConnectionName: "claimtx-outbox-test",
	}}
}

// killingPublisher is the relay process's publisher: once RabbitMQ
// confirmed a Publish, the process SIGKILLs itself, before the relay can
// mark the rows. That is the window a crash must hit to cause resends.
type killingPublisher struct{ message.Publisher }

func (p killingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // never return to the relay
}

// TestRelayProcess is not a test: it is the relay process that
// TestRelayKilledBetweenPublishAndMark starts and kills.
func TestRelayProcess(t *testing.T) {
	if os.Getenv(relayProcessEnv) == "" {
		t.Skip("run by TestRelayKilledBetweenPublishAndMark")
	}
	pool := testenv.Pool(t, os.Getenv(relaySchemaEnv), 4)
	st, err := store.New(pool, store.Config{Schema: os.Getenv(relaySchemaEnv)})
	require.NoError(t, err)
	pub, err := brokers.NewPublisher(amqpBrokers(), nil)
	require.NoError(t, err)
	relay, err := outbox.New(st, killingPublisher{pub}, outbox.Config{})
	require.NoError(t, err)
	require.NoError(t, relay.Run(context.Background()))
	t.Fatal("the relay returned instead of being killed")
}

// A relay process is SIGKILLed after RabbitMQ confirmed its batch and
// before it marked the rows. A relay started afterwards publishes the same
// rows again; the downstream claimtx consumer, keyed by
// metadata:claimtx_idempotency_key, applies each message once and records
// every resend as a duplicate.
func TestRelayKilledBetweenPublishAndMark(t *testing.T) {
	t.Parallel()
	if os.Getenv(relayProcessEnv) != "" {
		t.Skip("inside the relay process")
	}
	const n = 20
	e := setup(t, 6)
	topic := "claimtx-test-outbox-kill-" + watermill.NewShortUUID()
	e.enqueue(t, topic, "m", n)

	cmd := exec.Command(os.Args[0], "-test.run=^TestRelayProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), relayProcessEnv+"=1", relaySchemaEnv+"="+e.schema)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "relay process: %v\n%s", err, out)
	ws, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "relay process was not killed: %v\n%s", err, out)
	require.Equal(t, int64(n), e.stats(t).Pending, "the killed relay marked nothing")

	// Downstream consumer on the RabbitMQ queue, and a healthy relay.
	pub, stopDownstream := e.runDownstream(t, amqpBrokers(), topic, nil)
	defer stopDownstream()
	relay, err := outbox.New(e.st, pub, outbox.Config{})
	require.NoError(t, err)
	stop := runRelay(t, relay.Run)

	eventually(t, func() bool { return e.rec.count(framework.Applied)+e.rec.count(framework.Duplicate) == 2*n })
	stop()
	require.Equal(t, n, e.rec.count(framework.Applied))
	require.Equal(t, n, e.rec.count(framework.Duplicate), "every resend of the killed relay's batch is a duplicate")
	require.Zero(t, e.stats(t).Pending)
	e.requireEachEffectOnce(t, n)
}
