package consumer_test

import (
	"bytes"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/amqp" // registers the kind
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
)

func eventTime(t *testing.T) framework.TimeFunc {
	t.Helper()
	f, err := framework.ParseTimeSpec("metadata:event_time")
	require.NoError(t, err)
	return f
}

// A consumer whose claims are kept for less time than the broker can still
// deliver a message says so, with both numbers, in its log, its metrics and
// its readiness report, or refuses to start when told to be strict.
func TestRetentionShorterThanKafkaHorizon(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	br := startKafka(t)
	topic := "horizon-" + randHex()
	week := "604800000"
	createTopics(t, kafkaClient(t, br), 1, map[string]*string{"retention.ms": &week}, topic, topic+poisonSuffix)
	pool, schema := testenv.Setup(t, 4)
	config := func(retention time.Duration, logs *bytes.Buffer, reg prometheus.Registerer) consumer.Config {
		cfg := baseConfig("horizon", topic, pool, schema, fastKafka(br.Addrs(), ""))
		cfg.Claim.EventTime, cfg.Retention, cfg.Registerer = eventTime(t), retention, reg
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
		return cfg
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
	require.Equal(t, (24 * time.Hour).Seconds(), testenv.RequireMetric(t, reg, "claimtx_claim_retention_seconds"))
	require.Equal(t, (7 * 24 * time.Hour).Seconds(), testenv.RequireMetric(t, reg, "claimtx_replay_horizon_seconds"))
	require.NoError(t, c.Close())

	// Strict: New refuses, naming Retention.
	strict := config(24*time.Hour, &bytes.Buffer{}, nil)
	strict.StrictRetentionHorizon = true
	_, err = consumer.New(ctx, strict, noop)
	requireConfigError(t, err, "Retention")

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
	pool, schema := testenv.Setup(t, 4)
	for _, tc := range []struct {
		name string
		args map[string]any
		warn string
	}{
		{"no TTL", nil, "is shorter than the broker's replay horizon unbounded"},
		{"TTL within retention", map[string]any{"x-message-ttl": 3600000}, ""},
	} {
		cfg := baseConfig("horizon", "horizon-"+randHex(), pool, schema,
			brokers.Config{Kind: brokers.KindAMQP, AMQP: brokers.AMQPConfig{URL: "amqp://guest:guest@127.0.0.1:5672/", QueueArguments: tc.args}})
		requireHorizonAgainst2h(t, cfg, tc.name, tc.warn)
	}
}

// requireHorizonAgainst2h starts the consumer of cfg with a 2h retention
// and requires the warning warn in its log and an unbounded horizon
// metric, or (warn empty) no warning and a horizon of an hour.
func requireHorizonAgainst2h(t *testing.T, cfg consumer.Config, name, warn string) {
	t.Helper()
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	cfg.Claim.EventTime, cfg.Retention, cfg.Registerer = eventTime(t), 2*time.Hour, reg
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	c, err := consumer.New(t.Context(), cfg, noop)
	require.NoError(t, err, name)
	if warn != "" {
		require.Contains(t, logs.String(), warn, name)
		require.Equal(t, math.Inf(1), testenv.RequireMetric(t, reg, "claimtx_replay_horizon_seconds"), name)
	} else {
		require.NotContains(t, logs.String(), "replay horizon", name)
		require.Equal(t, time.Hour.Seconds(), testenv.RequireMetric(t, reg, "claimtx_replay_horizon_seconds"), name)
	}
	require.NoError(t, c.Close())
}

// A JetStream stream keeps a message for its max_age, unbounded without
// one (a count limit only removes messages sooner).
func TestRetentionAgainstNATSMaxAge(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Setup(t, 4)
	nc, err := natsgo.Connect(natsgo.DefaultURL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := nc.JetStream()
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		stream natsgo.StreamConfig
		warn   string
	}{
		{"count limit only", natsgo.StreamConfig{MaxMsgs: 1000}, "is shorter than the broker's replay horizon unbounded"},
		{"max age within retention", natsgo.StreamConfig{MaxAge: time.Hour}, ""},
	} {
		topic := "horizon-" + randHex()
		t.Cleanup(func() { deleteNATSStreams(t, topic) })
		for _, subj := range []string{topic, topic + poisonSuffix} {
			sc := tc.stream
			sc.Name, sc.Subjects = strings.ReplaceAll(subj, ".", "_"), []string{subj}
			_, err := js.AddStream(&sc)
			require.NoError(t, err, tc.name)
		}
		requireHorizonAgainst2h(t, baseConfig("horizon", topic, pool, schema, brokers.Config{Kind: brokers.KindNATS}), tc.name, tc.warn)
	}
}
