package consumer_test

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/amqp"  // registers the kind
	_ "github.com/claimtx/claimtx/brokers/kafka" // registers the kind
	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

func eventTime(t *testing.T) framework.TimeFunc {
	t.Helper()
	f, err := framework.ParseTimeSpec("metadata:event_time")
	require.NoError(t, err)
	return f
}

func noop(context.Context, pgx.Tx, *message.Message) error { return nil }

// A consumer whose claims are kept for less time than the broker can still
// deliver a message says so, with both numbers, in its log, its metrics and
// its readiness report, or refuses to start when told to be strict.
func TestRetentionShorterThanKafkaHorizon(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	br, err := kafkatest.Start(ctx, kafkatest.Options{Addr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = br.Close() })
	topic := "horizon-" + randHex()
	cl, err := kgo.NewClient(kgo.SeedBrokers(br.Addrs()...))
	require.NoError(t, err)
	defer cl.Close()
	week := "604800000"
	for _, name := range []string{topic, topic + ".poison"} {
		_, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, map[string]*string{"retention.ms": &week}, name)
		require.NoError(t, err)
	}
	pool, schema := testenv.Setup(t, 4)
	config := func(retention time.Duration, logs *bytes.Buffer, reg prometheus.Registerer) consumer.Config {
		return consumer.Config{
			Name: "horizon", Topic: topic, Key: "metadata:event_id", Pool: pool,
			Store:     store.Config{Schema: schema},
			Broker:    brokers.Config{Kind: brokers.KindKafka, Kafka: brokers.KafkaConfig{Brokers: br.Addrs()}},
			Claim:     middleware.Claim{EventTime: eventTime(t)},
			Retention: retention, Registerer: reg,
			Logger: slog.New(slog.NewTextHandler(logs, nil)),
		}
	}

	// Claims kept a day, the topics keep a week: a warning, not a failure.
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	c, err := consumer.New(ctx, config(24*time.Hour, &logs, reg), noop)
	require.NoError(t, err)
	require.Contains(t, logs.String(), "claim retention 24h0m0s is shorter than the broker's replay horizon 168h0m0s")
	rep := c.Health().Check(ctx)
	require.True(t, rep.Ready, "%v", rep.Checks)
	require.True(t, strings.HasPrefix(rep.Checks["retention_horizon"], "warning: claim retention 24h0m0s"), "%v", rep.Checks)
	require.Equal(t, (24 * time.Hour).Seconds(), testutil.ToFloat64(mustGauge(t, reg, "claimtx_claim_retention_seconds")))
	require.Equal(t, (7 * 24 * time.Hour).Seconds(), testutil.ToFloat64(mustGauge(t, reg, "claimtx_replay_horizon_seconds")))
	require.NoError(t, c.Close())

	// Strict: New refuses, naming Retention.
	strict := config(24*time.Hour, &bytes.Buffer{}, nil)
	strict.StrictRetentionHorizon = true
	_, err = consumer.New(ctx, strict, noop)
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "Retention", ce.Field)

	// Claims kept longer than the topics keep messages: nothing to say.
	logs.Reset()
	strict = config(8*24*time.Hour, &logs, nil)
	strict.StrictRetentionHorizon = true
	c, err = consumer.New(ctx, strict, noop)
	require.NoError(t, err)
	require.NotContains(t, logs.String(), "replay horizon")
	require.NotContains(t, c.Health().Check(ctx).Checks, "retention_horizon")
	require.NoError(t, c.Close())
}

// A RabbitMQ queue keeps a message until it is acked: unbounded, unless
// the queue has a message TTL.
func TestRetentionAgainstRabbitMQTTL(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, schema := testenv.Setup(t, 4)
	for _, tc := range []struct {
		name string
		args map[string]any
		warn string
	}{
		{"no TTL", nil, "is shorter than the broker's replay horizon unbounded"},
		{"TTL within retention", map[string]any{"x-message-ttl": 3600000}, ""},
	} {
		var logs bytes.Buffer
		reg := prometheus.NewRegistry()
		c, err := consumer.New(ctx, consumer.Config{
			Name: "horizon", Topic: "horizon-" + randHex(), Key: "metadata:event_id", Pool: pool,
			Store:     store.Config{Schema: schema},
			Broker:    brokers.Config{Kind: brokers.KindAMQP, AMQP: brokers.AMQPConfig{URL: "amqp://guest:guest@127.0.0.1:5672/", QueueArguments: tc.args}},
			Claim:     middleware.Claim{EventTime: eventTime(t)},
			Retention: 2 * time.Hour, Registerer: reg,
			Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		}, noop)
		require.NoError(t, err, tc.name)
		if tc.warn != "" {
			require.Contains(t, logs.String(), tc.warn, tc.name)
			require.Equal(t, math.Inf(1), testutil.ToFloat64(mustGauge(t, reg, "claimtx_replay_horizon_seconds")), tc.name)
		} else {
			require.NotContains(t, logs.String(), "replay horizon", tc.name)
			require.Equal(t, time.Hour.Seconds(), testutil.ToFloat64(mustGauge(t, reg, "claimtx_replay_horizon_seconds")), tc.name)
		}
		require.NoError(t, c.Close())
	}
}

// mustGauge finds the one gauge named name in reg.
func mustGauge(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name})
			g.Set(mf.GetMetric()[0].GetGauge().GetValue())
			return g
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}
