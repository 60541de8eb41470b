package kafka_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/kafka"
	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/kafkarecord"
	"github.com/claimtx/claimtx/internal/testenv"
)

// createTopic creates a topic with the given partition count (auto-created
// topics get the broker's default) and returns its name.
func createTopic(t *testing.T, b *kafkatest.Broker, partitions int32) string {
	t.Helper()
	topic := uniqueName(t)
	adm := newAdmin(t, b)
	res, err := adm.CreateTopic(t.Context(), partitions, 1, nil, topic)
	require.NoError(t, err)
	require.NoError(t, res.Err)
	return topic
}

// windowTopic is the opening of most window tests: a broker, a config
// handing out up to window records unacked, and a topic of the given
// partitions already holding produced records.
func windowTopic(t *testing.T, window int, partitions int32, produced int) (*kafkatest.Broker, brokers.KafkaConfig, string) {
	t.Helper()
	b := startBroker(t)
	cfg := testConfig(t, b)
	cfg.Window = window
	topic := createTopic(t, b, partitions)
	produce(t, cfg, topic, produced)
	return b, cfg, topic
}

func newAdmin(t *testing.T, b *kafkatest.Broker) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// produce publishes n messages with payloads "0".."n-1" in order.
func produce(t *testing.T, cfg brokers.KafkaConfig, topic string, n int) {
	t.Helper()
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))
	}
	publish(t, cfg, topic, msgs...)
}

// committed returns the group's committed offset for topic/partition, or -1
// when there is none.
func committed(t *testing.T, adm *kadm.Client, group, topic string, partition int32) int64 {
	t.Helper()
	offs, err := adm.FetchOffsets(t.Context(), group)
	require.NoError(t, err)
	o, ok := offs.Lookup(topic, partition)
	if !ok {
		return -1
	}
	require.NoError(t, o.Err)
	return o.At
}

// awaitCommitted polls until the committed offset is want.
func awaitCommitted(t *testing.T, adm *kadm.Client, group, topic string, partition int32, want int64) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := committed(t, adm, group, topic, partition)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("committed offset of %s/%d is %d, want %d", topic, partition, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// requireNone asserts that no message arrives within wait.
func requireNone(t *testing.T, ch <-chan *message.Message, wait time.Duration) {
	t.Helper()
	select {
	case m, ok := <-ch:
		if ok {
			t.Fatalf("unexpected message %s (offset %s)", m.Payload, m.Metadata.Get(kafkarecord.KafkaOffset))
		}
		t.Fatal("messages channel closed")
	case <-time.After(wait):
	}
}

// subscribe returns a subscriber and its subscription to topic. The caller
// closes it with a defer: in a t.Cleanup it would be closed after
// t.Context() ended, which stops the dev broker (see startBroker), and its
// last offset commit would retry against a dead broker.
func subscribe(t *testing.T, cfg brokers.KafkaConfig, topic string) (message.Subscriber, <-chan *message.Message) {
	t.Helper()
	sub, err := kafka.NewSubscriber(context.Background(), cfg, nil)
	require.NoError(t, err)
	msgs, err := sub.Subscribe(t.Context(), topic)
	if err != nil {
		_ = sub.Close()
	}
	require.NoError(t, err)
	return sub, msgs
}

func closeSub(t *testing.T, sub message.Subscriber) {
	t.Helper()
	require.NoError(t, sub.Close())
}

// TestWindowHoldsWindow: up to Window messages of one partition are handed
// out unacked, not one more; acking them lets the rest through, each once
// and in order.
func TestWindowHoldsWindow(t *testing.T) {
	t.Parallel()
	const n = 5
	_, cfg, topic := windowTopic(t, n, 1, 3*n)

	sub, msgs := subscribe(t, cfg, topic)
	defer closeSub(t, sub)
	var held []*message.Message
	for range n {
		held = append(held, receive(t, msgs, 15*time.Second))
	}
	requireNone(t, msgs, 300*time.Millisecond)

	got := make([]string, 0, 3*n)
	for _, m := range held {
		got = append(got, string(m.Payload))
		require.True(t, m.Ack())
	}
	for len(got) < 3*n {
		m := receive(t, msgs, 15*time.Second)
		got = append(got, string(m.Payload))
		require.True(t, m.Ack())
	}
	want := make([]string, 3*n)
	for i := range want {
		want[i] = strconv.Itoa(i)
	}
	require.Equal(t, want, got, "each message once, in partition order")
	requireNone(t, msgs, 300*time.Millisecond)
}

// TestWindowOutOfOrderAcks: the committed offset does not pass an unacked
// message, however many later ones are acked.
func TestWindowOutOfOrderAcks(t *testing.T) {
	t.Parallel()
	const n = 5
	b, cfg, topic := windowTopic(t, n, 1, n)
	adm := newAdmin(t, b)

	sub, msgs := subscribe(t, cfg, topic)
	defer closeSub(t, sub)
	var held []*message.Message
	for i := range n {
		m := receive(t, msgs, 15*time.Second)
		require.Equal(t, strconv.Itoa(i), m.Metadata.Get(kafkarecord.KafkaOffset))
		held = append(held, m)
	}
	for _, m := range held[1:] {
		require.True(t, m.Ack())
	}
	// Several commit intervals: the offset must stay at or before message 0.
	until := time.Now().Add(8 * cfg.CommitInterval)
	for time.Now().Before(until) {
		got := committed(t, adm, cfg.ConsumerGroup, topic, 0)
		require.LessOrEqual(t, got, int64(0), "committed offset passed the unacked message 0")
		time.Sleep(20 * time.Millisecond)
	}

	require.True(t, held[0].Ack())
	awaitCommitted(t, adm, cfg.ConsumerGroup, topic, 0, n)
}

// TestWindowNack: a nacked message comes back as a new copy after NackDelay
// while the messages behind it keep flowing.
func TestWindowNack(t *testing.T) {
	t.Parallel()
	const n = 4
	b, cfg, topic := windowTopic(t, n, 1, n+2)
	cfg.NackDelay = time.Second
	adm := newAdmin(t, b)

	sub, msgs := subscribe(t, cfg, topic)
	defer closeSub(t, sub)
	first := receive(t, msgs, 15*time.Second)
	require.Equal(t, "0", string(first.Payload))
	nackedAt := time.Now()
	require.True(t, first.Nack())

	// Messages 1..n+1 arrive while message 0 waits out its delay: 1..n-1
	// fill the rest of the window, their acks make room for n and n+1.
	for i := 1; i <= n+1; i++ {
		m := receive(t, msgs, 15*time.Second)
		require.Equal(t, strconv.Itoa(i), string(m.Payload))
		require.True(t, m.Ack())
	}
	require.Less(t, time.Since(nackedAt), cfg.NackDelay, "later messages were held up by the nack")
	require.Equal(t, int64(-1), committed(t, adm, cfg.ConsumerGroup, topic, 0), "nothing committed past the nacked message")

	again := receive(t, msgs, 15*time.Second)
	require.GreaterOrEqual(t, time.Since(nackedAt), cfg.NackDelay)
	require.NotSame(t, first, again)
	require.Equal(t, first.UUID, again.UUID)
	require.Equal(t, first.Payload, again.Payload)
	require.Equal(t, first.Metadata, again.Metadata)
	require.NoError(t, again.Context().Err())
	require.True(t, again.Ack(), "the copy can be acked")
	awaitCommitted(t, adm, cfg.ConsumerGroup, topic, 0, n+2)
}

// TestWindowRestart: after Close, a new member of the group starts at the
// first message that was not acked; the unacked ones are not lost.
func TestWindowRestart(t *testing.T) {
	t.Parallel()
	const n = 5
	b, cfg, topic := windowTopic(t, n, 1, 2*n)
	adm := newAdmin(t, b)

	sub1, msgs1 := subscribe(t, cfg, topic)
	defer closeSub(t, sub1) // Close is idempotent
	var held []*message.Message
	for range n {
		held = append(held, receive(t, msgs1, 15*time.Second))
	}
	// Ack 0, 1, 2 and 4: the prefix ends at 3.
	for _, i := range []int{0, 1, 2, 4} {
		require.True(t, held[i].Ack())
	}
	awaitCommitted(t, adm, cfg.ConsumerGroup, topic, 0, 3)
	start := time.Now()
	require.NoError(t, sub1.Close(), "Close does not wait for the unacked messages")
	require.Less(t, time.Since(start), cfg.RebalanceTimeout)
	_, open := <-msgs1
	require.False(t, open, "channel closed by Close")
	require.True(t, held[3].Ack(), "a late ack is harmless")
	require.Equal(t, int64(3), committed(t, adm, cfg.ConsumerGroup, topic, 0), "a late ack is not committed")

	sub2, msgs2 := subscribe(t, cfg, topic)
	defer closeSub(t, sub2)
	first := receive(t, msgs2, 15*time.Second)
	require.Equal(t, "3", first.Metadata.Get(kafkarecord.KafkaOffset))
	got := []string{string(first.Payload)}
	require.True(t, first.Ack())
	for len(got) < 2*n-3 {
		m := receive(t, msgs2, 15*time.Second)
		got = append(got, string(m.Payload))
		require.True(t, m.Ack())
	}
	require.Equal(t, []string{"3", "4", "5", "6", "7", "8", "9"}, got)
	awaitCommitted(t, adm, cfg.ConsumerGroup, topic, 0, 2*n)
}

// TestWindowMetadataMatchesDefault: both modes turn the same record into the
// same message.
func TestWindowMetadataMatchesDefault(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, startBroker(t))
	topic := uniqueName(t)

	sent := keyedMessage("uuid-win", "evt-win", "customer-9")
	publish(t, cfg, topic, sent)

	consume := func(c brokers.KafkaConfig) *message.Message {
		sub, msgs := subscribe(t, c, topic)
		defer closeSub(t, sub)
		m := receive(t, msgs, 15*time.Second)
		require.True(t, m.Ack())
		return m
	}
	def := consume(cfg)
	wcfg := cfg
	wcfg.ConsumerGroup = cfg.ConsumerGroup + "-window"
	wcfg.Window = 3
	win := consume(wcfg)

	require.Equal(t, def.UUID, win.UUID)
	require.Equal(t, def.Payload, win.Payload)
	require.Equal(t, def.Metadata, win.Metadata)
	require.Equal(t, "customer-9", win.Metadata.Get(kafkarecord.KafkaKey))
	require.NotEmpty(t, win.Metadata.Get(kafkarecord.KafkaTimestamp))
	require.Len(t, win.Metadata, 7)
}

// TestWindowRebalance: a member that holds unacked messages and has more
// waiting to be handed out lets a rebalance through at once; the acks it
// gets after its session ended are harmless, and the group still consumes
// and commits every message (redeliveries allowed).
func TestWindowRebalance(t *testing.T) {
	t.Parallel()
	const total = 40
	b, cfg, topic := windowTopic(t, 4, 4, total)
	adm := newAdmin(t, b)

	var mu sync.Mutex
	seen := map[string]int{}
	record := func(m *message.Message) {
		mu.Lock()
		defer mu.Unlock()
		seen[string(m.Payload)]++
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(done)
		wg.Wait()
	}()
	consume := func(ch <-chan *message.Message, first chan<- struct{}) {
		wg.Go(func() {
			for {
				select {
				case m, ok := <-ch:
					if !ok {
						return
					}
					record(m)
					m.Ack()
					if first != nil {
						close(first)
						first = nil
					}
				case <-done:
					return
				}
			}
		})
	}

	// Member 1 holds three messages unacked; its handler is blocked
	// handing out the next ones, which nobody reads yet.
	sub1, msgs1 := subscribe(t, cfg, topic)
	defer closeSub(t, sub1)
	var late []*message.Message
	for range 3 {
		m := receive(t, msgs1, 15*time.Second)
		record(m)
		late = append(late, m)
	}

	// Member 2 joins. The rebalance completes only once member 1 has
	// rejoined, which it can only do once its ConsumeClaims returned.
	joined := time.Now()
	sub2, msgs2 := subscribe(t, cfg, topic)
	defer closeSub(t, sub2)
	first := make(chan struct{})
	consume(msgs2, first)
	select {
	case <-first:
	case <-time.After(15 * time.Second):
		t.Fatal("member 2 received nothing")
	}
	require.Less(t, time.Since(joined), cfg.RebalanceTimeout, "the rebalance waited for member 1")

	// The held messages belong to member 1's first session, which is
	// over: acking them now marks nothing; they are delivered again. Their
	// contexts outlive the session (work on them may finish) and end with
	// the ack.
	for _, m := range late {
		require.NoError(t, m.Context().Err())
		require.True(t, m.Ack())
	}
	for _, m := range late {
		select {
		case <-m.Context().Done():
		case <-time.After(15 * time.Second):
			t.Fatal("message context not cancelled after the ack")
		}
	}
	consume(msgs1, nil)

	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n == total {
			break
		}
		require.False(t, time.Now().After(deadline), "received %d of %d distinct messages", n, total)
		time.Sleep(20 * time.Millisecond)
	}
	// Every partition's committed offset reaches its end.
	for {
		offs, err := adm.FetchOffsets(t.Context(), cfg.ConsumerGroup)
		require.NoError(t, err)
		ends, err := adm.ListEndOffsets(t.Context(), topic)
		require.NoError(t, err)
		ok := true
		ends.Each(func(e kadm.ListedOffset) {
			o, found := offs.Lookup(topic, e.Partition)
			if e.Offset > 0 && (!found || o.At != e.Offset) {
				ok = false
			}
		})
		if ok {
			break
		}
		require.False(t, time.Now().After(deadline), "committed offsets %v do not reach the end offsets %v", offs, ends)
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWindowConfig: a negative window is refused, and the window is printed.
func TestWindowConfig(t *testing.T) {
	t.Parallel()
	err := brokers.KafkaConfig{Window: -1}.Validate()
	var ce *framework.ConfigError
	require.True(t, errors.As(err, &ce), "got %v", err)
	require.Equal(t, "window", ce.Field)
	_, err = kafka.NewSubscriber(context.Background(), brokers.KafkaConfig{Window: -1}, nil)
	require.True(t, errors.As(err, &ce), "got %v", err)
	require.Equal(t, "window", ce.Field)

	// A rebalance shorter than the session would go on without live
	// members that had not heartbeated yet, again and again.
	err = brokers.KafkaConfig{SessionTimeout: 10 * time.Second, RebalanceTimeout: 5 * time.Second}.Validate()
	require.True(t, errors.As(err, &ce), "got %v", err)
	require.Equal(t, "rebalance_timeout", ce.Field)
	require.NoError(t, brokers.KafkaConfig{SessionTimeout: 3 * time.Second, RebalanceTimeout: 3 * time.Second}.Validate())

	require.NoError(t, brokers.KafkaConfig{Window: 100}.Validate())
	require.Contains(t, brokers.KafkaConfig{Window: 100}.String(), "Window:100")
}

func recordOf(t *testing.T, m *message.Message) kafkarecord.Record {
	t.Helper()
	r, ok := kafkarecord.FromContext(m.Context())
	require.True(t, ok, "message context carries its record's place")
	return r
}

func settledBelow(t *testing.T, r kafkarecord.Record, settling ...int64) int64 {
	t.Helper()
	off, ok := r.Of.SettledBelow(settling)
	require.True(t, ok)
	return off
}

// TestSettledBelowOutOfOrderAcks: with a window of several records in
// flight, the settled position is the lowest offset neither acked nor
// settling, not the last offset acked.
func TestSettledBelowOutOfOrderAcks(t *testing.T) {
	t.Parallel()
	const n = 5
	_, cfg, topic := windowTopic(t, n, 1, n)

	sub, msgs := subscribe(t, cfg, topic)
	defer closeSub(t, sub)
	var held []*message.Message
	for i := range n {
		m := receive(t, msgs, 15*time.Second)
		r := recordOf(t, m)
		require.Equal(t, topic, r.Topic)
		require.Equal(t, int32(0), r.Partition)
		require.Equal(t, int64(i), r.Offset)
		held = append(held, m)
	}
	r := recordOf(t, held[0])
	require.Equal(t, int64(0), settledBelow(t, r))
	require.Equal(t, int64(1), settledBelow(t, r, 0))
	require.Equal(t, int64(0), settledBelow(t, r, 3), "record 0 is still in flight")
	require.Equal(t, int64(n), settledBelow(t, r, 0, 1, 2, 3, 4))

	// Acks out of order: 2 and 3 first.
	require.True(t, held[2].Ack())
	require.True(t, held[3].Ack())
	require.Eventually(t, func() bool { return settledBelow(t, r, 0, 1) == 4 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, int64(1), settledBelow(t, r, 0), "1 is in flight")
	require.Equal(t, int64(0), settledBelow(t, r, 4))
	require.True(t, held[4].Ack())
	require.Eventually(t, func() bool { return settledBelow(t, r, 0, 1) == n }, 5*time.Second, 5*time.Millisecond)
	require.True(t, held[0].Ack())
	require.Eventually(t, func() bool { return settledBelow(t, r) == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, int64(n), settledBelow(t, r, 1))
	require.True(t, held[1].Ack())
	require.Eventually(t, func() bool { return settledBelow(t, r) == n }, 5*time.Second, 5*time.Millisecond)

	// A partition no longer this member's says nothing.
	closeSub(t, sub)
	_, ok := r.Of.SettledBelow(nil)
	require.False(t, ok)
}

// mapLoader is a kafkarecord.Loader over fixed positions (the store's is
// tested with Postgres in internal/claimsql and examples/loyalty).
type mapLoader map[int32]int64

func (l mapLoader) LoadPositions(_ context.Context, _ string, parts []int32) (map[int32]int64, error) {
	out := map[int32]int64{}
	for _, p := range parts {
		if off, ok := l[p]; ok {
			out[p] = off
		}
	}
	return out, nil
}

// fiveRecords is a fresh topic of one partition holding five records, and
// a subscriber closed when the test ends.
func fiveRecords(t *testing.T, b *kafkatest.Broker) (brokers.KafkaConfig, string, message.Subscriber) {
	t.Helper()
	cfg := testConfig(t, b)
	topic := createTopic(t, b, 1)
	produce(t, cfg, topic, 5)
	sub, err := kafka.NewSubscriber(context.Background(), cfg, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { closeSub(t, sub) })
	return cfg, topic, sub
}

type skip struct {
	topic         string
	partition     int32
	group, stored int64
}

// TestStartsAtStoredPosition: a partition whose stored position is past
// the group's offset starts there and says so; with Replay it starts at
// the group's offset; a stored position past the partition's end (a
// topic created again) is ignored.
func TestStartsAtStoredPosition(t *testing.T) {
	t.Parallel()
	b := startBroker(t)
	for _, c := range []struct {
		name      string
		stored    int64
		replay    bool
		wantFirst int64
		wantSkip  bool
	}{
		{name: "skip", stored: 3, wantFirst: 3, wantSkip: true},
		{name: "replay", stored: 3, replay: true, wantFirst: 0},
		{name: "past the end", stored: 100, wantFirst: 0},
		{name: "at the group offset", stored: 0, wantFirst: 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, topic, sub := fiveRecords(t, b)
			var mu sync.Mutex
			var skips []skip
			require.True(t, kafkarecord.Attach(sub, kafkarecord.Options{
				Loader: mapLoader{0: c.stored},
				Replay: c.replay,
				Skipped: func(topic string, partition int32, group, stored int64) {
					mu.Lock()
					defer mu.Unlock()
					skips = append(skips, skip{topic, partition, group, stored})
				},
			}))
			m, _ := testenv.SubscribeReceive(t, sub, topic, 15*time.Second)
			require.Equal(t, strconv.FormatInt(c.wantFirst, 10), m.Metadata.Get(kafkarecord.KafkaOffset))
			require.True(t, m.Ack())
			mu.Lock()
			defer mu.Unlock()
			if c.wantSkip {
				require.Equal(t, []skip{{topic, 0, -1, c.stored}}, skips)
			} else {
				require.Empty(t, skips)
			}
		})
	}
}

// A partition started at its stored position commits that position: with
// no record past it nothing else would, and the group's offset would stay
// below the records the claims settled, its lag never reaching zero (a
// chaos run's drain waited on it after a broker restart lost the commits).
func TestSkippedPositionCommitted(t *testing.T) {
	t.Parallel()
	b := startBroker(t)
	cfg, topic, sub := fiveRecords(t, b)
	skipped := make(chan struct{}, 1)
	require.True(t, kafkarecord.Attach(sub, kafkarecord.Options{
		Loader:  mapLoader{0: 5}, // every record settled
		Skipped: func(string, int32, int64, int64) { skipped <- struct{}{} },
	}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	select {
	case <-skipped:
	case <-time.After(15 * time.Second):
		t.Fatal("the partition did not start at its stored position")
	}
	awaitCommitted(t, newAdmin(t, b), cfg.ConsumerGroup, topic, 0, 5)
}
