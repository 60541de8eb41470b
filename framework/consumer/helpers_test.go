package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/kafka" // registers the kind
	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

// discard is the logger of the tests that read no logs.
var discard = slog.New(slog.DiscardHandler)

// noop is a handler with no effect, for tests about everything else.
func noop(context.Context, pgx.Tx, *message.Message) error { return nil }

// insertEventID writes the message's event_id header into effects.
func insertEventID(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1)", msg.Metadata.Get("event_id"))
	return err
}

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

// queryInt is the integer (a count(*)) that sql returns, failing the test on
// an error.
func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	return int(testenv.Scalar(t, pool, sql, args...))
}

// baseConfig is the Config the tests start from: consumer name on topic,
// keyed by the event_id header, its claims in schema, no log.
func baseConfig(name, topic string, pool *pgxpool.Pool, schema string, bcfg brokers.Config) consumer.Config {
	return consumer.Config{
		Name: name, Topic: topic, Key: "metadata:event_id", Pool: pool,
		Store: store.Config{Schema: schema}, Broker: bcfg, Logger: discard,
		Claim: middleware.Claim{MaxGroup: testenv.MaxGroup()},
	}
}

// runUntilCancel runs c until ctx is cancelled and returns once it is consuming;
// Run's result arrives on the channel.
func runUntilCancel(ctx context.Context, c *consumer.Consumer) <-chan error {
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-c.Running()
	return done
}

// runConsumer builds the consumer of cfg over h, closed when the test
// ends, and runs it until ctx is cancelled, as runUntilCancel does.
func runConsumer(t *testing.T, ctx context.Context, cfg consumer.Config, h middleware.TxHandlerFunc) <-chan error {
	t.Helper()
	c, err := consumer.New(ctx, cfg, h)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return runUntilCancel(ctx, c)
}

// stopConsumer cancels Run's context and requires Run to return nil.
func stopConsumer(t *testing.T, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	cancel()
	require.NoError(t, <-done)
}

// newPublisher opens a publisher on bcfg, closed when the test ends.
func newPublisher(t *testing.T, bcfg brokers.Config) message.Publisher {
	t.Helper()
	pub, err := brokers.NewPublisher(bcfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// subscribePoison subscribes on bcfg to topic's poison topic, until the
// test ends.
func subscribePoison(t *testing.T, ctx context.Context, bcfg brokers.Config, topic string) <-chan *message.Message {
	t.Helper()
	sub, err := brokers.NewSubscriber(bcfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	poisoned, err := sub.Subscribe(ctx, topic+poisonSuffix)
	require.NoError(t, err)
	return poisoned
}

// pubPoisoned is a publisher on bcfg and subscribePoison.
func pubPoisoned(t *testing.T, ctx context.Context, bcfg brokers.Config, topic string) (message.Publisher, <-chan *message.Message) {
	t.Helper()
	return newPublisher(t, bcfg), subscribePoison(t, ctx, bcfg, topic)
}

// goChannel is an in-process broker private to the test's schema that
// keeps what is published before anyone subscribes.
func goChannel(schema string) brokers.Config {
	bcfg := brokers.Config{}
	bcfg.Kind = brokers.KindGoChannel
	bcfg.GoChannel.Name = schema
	bcfg.GoChannel.Persistent = true
	return bcfg
}

// fastKafka is a Kafka config on brokers whose group settles and commits
// quickly, for tests that wait on it.
func fastKafka(addrs []string, group string) brokers.Config {
	return brokers.Config{Kind: brokers.KindKafka, Kafka: brokers.KafkaConfig{
		Brokers: addrs, ConsumerGroup: group,
		SessionTimeout: 2 * time.Second, HeartbeatInterval: 100 * time.Millisecond,
		RebalanceTimeout: 3 * time.Second, CommitInterval: 100 * time.Millisecond,
		NackDelay: 10 * time.Millisecond,
	}}
}

// awaitPoisoned returns the next message on poisoned, acked, or fails the
// test with failure after wait.
func awaitPoisoned(t *testing.T, poisoned <-chan *message.Message, wait time.Duration, failure string) *message.Message {
	t.Helper()
	select {
	case m := <-poisoned:
		m.Ack()
		return m
	case <-time.After(wait):
		t.Fatal(failure)
		return nil
	}
}

// ordersTwice is n orders ({"order_id": i}), each published twice, and one
// message with the payload bad.
func ordersTwice(n int, bad string) []*message.Message {
	var msgs []*message.Message
	for range 2 {
		for i := 1; i <= n; i++ {
			msgs = append(msgs, testenv.Message(fmt.Sprintf(`{"order_id": %d}`, i)))
		}
	}
	return append(msgs, testenv.Message(bad))
}

func randHex() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// recorder counts the outcomes a consumer reports.
type recorder struct {
	mu  sync.Mutex
	got map[framework.Outcome]int
}

func newRecorder() *recorder { return &recorder{got: map[framework.Outcome]int{}} }

func (r *recorder) on(res middleware.Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got[res.Outcome]++
}

func (r *recorder) n(o framework.Outcome) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[o]
}

func (r *recorder) snapshot() map[framework.Outcome]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[framework.Outcome]int{}
	for k, v := range r.got {
		out[k] = v
	}
	return out
}

// requireConfigError requires err to be a *framework.ConfigError naming
// field, and returns it; msgAndArgs (the field by default) say which
// case failed.
func requireConfigError(t *testing.T, err error, field string, msgAndArgs ...any) *framework.ConfigError {
	t.Helper()
	if len(msgAndArgs) == 0 {
		msgAndArgs = []any{field}
	}
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce, msgAndArgs...)
	require.Equal(t, field, ce.Field, msgAndArgs...)
	return ce
}

// startKafka starts an in-process Kafka broker of the test's own (silent:
// the kafkatest default logger discards), closed when the test ends.
func startKafka(t *testing.T) *kafkatest.Broker {
	t.Helper()
	br, err := kafkatest.Start(t.Context(), kafkatest.Options{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = br.Close() })
	return br
}

// kafkaClient is a client of br with opts, closed when the test ends.
func kafkaClient(t *testing.T, br *kafkatest.Broker, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(br.Addrs()...)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

// createTopics creates each topic with partitions partitions and the topic
// configs (nil for the broker's defaults).
func createTopics(t *testing.T, cl *kgo.Client, partitions int32, configs map[string]*string, topics ...string) {
	t.Helper()
	for _, topic := range topics {
		_, err := kadm.NewClient(cl).CreateTopic(t.Context(), partitions, 1, configs, topic)
		require.NoError(t, err, topic)
	}
}
