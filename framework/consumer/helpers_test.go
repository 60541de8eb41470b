package consumer_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
)

// effectsDB is the opening most end-to-end tests here share: a schema of
// their own, the effects table their handler writes (columns as given),
// and a context they cancel to stop the consumer. The context is also
// cancelled when the test ends, so a test that fails early leaks no
// consumer.
func effectsDB(t *testing.T, maxConns int32, columns string) (*pgxpool.Pool, string, context.Context, context.CancelFunc) {
	t.Helper()
	pool, schema := testenv.Setup(t, maxConns)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	_, err := pool.Exec(ctx, "CREATE TABLE effects ("+columns+")")
	require.NoError(t, err)
	return pool, schema, ctx, cancel
}

// runUntilCancel runs c until ctx is cancelled and returns once it is consuming;
// Run's result arrives on the channel.
func runUntilCancel(ctx context.Context, c *consumer.Consumer) <-chan error {
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-c.Running()
	return done
}

// pubSub opens a publisher and a subscriber on bcfg, closed when the test
// ends.
func pubSub(t *testing.T, bcfg brokers.Config) (message.Publisher, message.Subscriber) {
	t.Helper()
	pub, err := brokers.NewPublisher(bcfg, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	sub, err := brokers.NewSubscriber(bcfg, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return pub, sub
}
