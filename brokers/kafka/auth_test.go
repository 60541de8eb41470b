package kafka_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/kafka"
	"github.com/claimtx/claimtx/framework"
)

// retryLogger counts the start-up loop's "not reachable yet" lines.
type retryLogger struct {
	watermill.NopLogger
	retries *atomic.Int32
}

func (l retryLogger) Info(msg string, _ watermill.LogFields) {
	if msg == "Kafka not reachable yet, retrying" {
		l.retries.Add(1)
	}
}

func (l retryLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// TestSASLRefusedIsAuthentication: a broker refusing the SASL credentials
// (kfake closes the connection, which Sarama reports as EOF, like a network
// fault) fails start-up at once with a *framework.AuthError, instead
// of being retried for DialTimeout as "not reachable".
func TestSASLRefusedIsAuthentication(t *testing.T) {
	t.Parallel()
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		for _, wrong := range []string{"password", "user"} {
			t.Run(mech+"/"+wrong, func(t *testing.T) {
				t.Parallel()
				c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(),
					kfake.Superuser(mech, "app", "app-secret"), kfake.AllowAutoTopicCreation())
				require.NoError(t, err)
				defer c.Close()
				cfg := brokers.KafkaConfig{
					Brokers:          c.ListenAddrs(),
					DialTimeout:      time.Minute,
					ReconnectBackoff: 100 * time.Millisecond,
					SASL:             brokers.KafkaSASLConfig{Mechanism: mech, User: "app", Password: "wrong-secret"},
				}
				if wrong == "user" {
					cfg.SASL.User, cfg.SASL.Password = "nobody", "app-secret"
				}
				var retries atomic.Int32
				start := time.Now()
				_, err = kafka.NewPublisher(context.Background(), cfg, retryLogger{retries: &retries})
				require.Error(t, err)
				require.ErrorAs(t, err, new(*framework.AuthError))
				var ae *framework.AuthError
				require.ErrorAs(t, err, &ae)
				require.Equal(t, "Kafka", ae.Dependency)
				require.Contains(t, err.Error(), "authentication failed")
				require.NotContains(t, err.Error(), "secret")
				require.Zero(t, retries.Load(), "retried as not reachable: %v", err)
				require.Less(t, time.Since(start), 10*time.Second)
			})
		}
	}
}

// TestUnreachableIsNotAuthentication: with SASL configured, a broker that
// is not there is retried and never reported as an authentication failure.
func TestUnreachableIsNotAuthentication(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser("PLAIN", "app", "app-secret"))
	require.NoError(t, err)
	addrs := c.ListenAddrs()
	c.Close()
	cfg := brokers.KafkaConfig{Brokers: addrs, DialTimeout: 3 * time.Second, ReconnectBackoff: 100 * time.Millisecond,
		SASL: brokers.KafkaSASLConfig{Mechanism: "PLAIN", User: "app", Password: "app-secret"}}
	var retries atomic.Int32
	_, err = kafka.NewPublisher(context.Background(), cfg, retryLogger{retries: &retries})
	require.Error(t, err)
	require.NotErrorAs(t, err, new(*framework.AuthError))
	require.Contains(t, err.Error(), "gave up after")
	require.Positive(t, retries.Load())
}
