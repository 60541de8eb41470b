package kafkatest

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/kafka"
	"github.com/claimtx/claimtx/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.VerifyTestMain(m)
}

const partitions = 4

// zombie is a group member that joins through the raw protocol and dies
// (its TCP connection closes) while its JoinGroup waits for the rebalance:
// the case kfake never gives a session timer to.
type zombie struct {
	conn     net.Conn
	memberID string
	corr     int32
}

func (z *zombie) send(t *testing.T, req kmsg.Request) {
	t.Helper()
	z.corr++
	buf := kmsg.NewRequestFormatter(kmsg.FormatterClientID("zombie")).AppendRequest(nil, req, z.corr)
	_, err := z.conn.Write(buf)
	require.NoError(t, err)
}

func (z *zombie) read(t *testing.T, resp kmsg.Response) {
	t.Helper()
	var size [4]byte
	_, err := io.ReadFull(z.conn, size[:])
	require.NoError(t, err)
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	_, err = io.ReadFull(z.conn, body)
	require.NoError(t, err)
	require.NoError(t, resp.ReadFrom(body[4:])) // skip the correlation ID (non-flexible versions)
}

func joinRequest(group, topic, memberID string, session time.Duration) *kmsg.JoinGroupRequest {
	req := kmsg.NewPtrJoinGroupRequest()
	req.Version = 5
	req.Group = group
	req.MemberID = memberID
	req.SessionTimeoutMillis = int32(session / time.Millisecond)
	req.RebalanceTimeoutMillis = 60_000
	req.ProtocolType = "consumer"
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{topic}
	p := kmsg.NewJoinGroupRequestProtocol()
	p.Name = "range" // Sarama's default balancer, so the protocols match
	p.Metadata = meta.AppendTo(nil)
	req.Protocols = []kmsg.JoinGroupRequestProtocol{p}
	return req
}

const zombieSession = 500 * time.Millisecond

// fixture is a broker with a topic and a live member A (the Watermill Kafka
// subscriber, Sarama underneath) that is the group's only member.
type fixture struct {
	b     *Broker
	group string
	topic string
	msgs  <-chan *message.Message
}

func newFixture(t *testing.T, opts Options) *fixture {
	t.Helper()
	opts.Addr = "127.0.0.1:0"
	opts.Partitions = partitions
	b, err := Start(t.Context(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })

	f := &fixture{b: b, group: "g-" + strings.ToLower(t.Name()), topic: "t-" + strings.ToLower(t.Name())}
	require.NoError(t, b.cluster.CreateTopic(f.topic, partitions, nil))

	sub, err := kafka.NewSubscriber(t.Context(), brokers.KafkaConfig{
		Brokers:           b.Addrs(),
		ConsumerGroup:     f.group,
		SessionTimeout:    3 * time.Second,
		HeartbeatInterval: 100 * time.Millisecond,
		RebalanceTimeout:  10 * time.Second,
		CommitInterval:    100 * time.Millisecond,
	}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sub.Close()) })
	f.msgs, err = sub.Subscribe(t.Context(), f.topic)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	_, err = b.cluster.WaitGroupStable(ctx, f.group, 1)
	require.NoError(t, err)
	return f
}

// addZombie has a new member join through the raw protocol and die: its
// TCP connection is closed from inside a control function, before kfake
// handles its JoinGroup. kfake adds it as a member and parks the JoinGroup
// until A rejoins; the reply then cannot be written. Whether kfake starts a
// session timer for it is a coin flip: its reply (client_conn.go,
// clientReq.reply) selects between a buffered response channel and the
// closed connection's done channel, and only "sent" starts the timer. A
// real broker would always start it. It returns the zombie's member ID once
// kfake lists it as a member.
func (f *fixture) addZombie(t *testing.T) string {
	t.Helper()
	return f.addZombieWithSession(t, zombieSession)
}

// addZombieWithSession is addZombie with the zombie's own session timeout.
func (f *fixture) addZombieWithSession(t *testing.T, session time.Duration) string {
	t.Helper()
	conn, err := net.Dial("tcp", f.b.Addrs()[0])
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	z := &zombie{conn: conn}

	// First join: kfake assigns the member ID (MEMBER_ID_REQUIRED, v4+).
	z.send(t, joinRequest(f.group, f.topic, "", session))
	var first kmsg.JoinGroupResponse
	first.Version = 5
	z.read(t, &first)
	require.Equal(t, kerr.MemberIDRequired.Code, first.ErrorCode)
	z.memberID = first.MemberID

	var once sync.Once
	f.b.cluster.ControlKey(int16(kmsg.JoinGroup), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if r, ok := req.(*kmsg.JoinGroupRequest); ok && r.MemberID == z.memberID {
			once.Do(func() { _ = conn.Close() })
			f.b.cluster.DropControl()
		}
		return nil, nil, false
	})
	z.send(t, joinRequest(f.group, f.topic, z.memberID, session))

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = f.b.cluster.WaitGroupInfo(ctx, f.group, func(g *kfake.GroupInfo) bool { return isMember(g, z.memberID) })
	require.NoError(t, err, "the zombie became a member")
	return z.memberID
}

func isMember(g *kfake.GroupInfo, memberID string) bool {
	if g == nil {
		return false
	}
	return slices.ContainsFunc(g.Members, func(m kfake.GroupMember) bool { return m.MemberID == memberID })
}

// produceToEachPartition writes one record per partition.
func (f *fixture) produceToEachPartition(t *testing.T) map[string]bool {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.b.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer cl.Close()
	want := map[string]bool{}
	for p := range int32(partitions) {
		v := fmt.Sprintf("p%d-%d", p, time.Now().UnixNano())
		want[v] = true
		require.NoError(t, cl.ProduceSync(t.Context(), &kgo.Record{Topic: f.topic, Partition: p, Value: []byte(v)}).FirstErr())
	}
	return want
}

// zombieAttempts bounds the coin flips (see addZombie): the chance that
// kfake times out every one of them itself is 2^-12.
const zombieAttempts = 12

// newEvictingFixture is a fixture whose broker evicts fast and reports
// each eviction on the channel, which has room for zombieAttempts.
func newEvictingFixture(t *testing.T) (*fixture, <-chan eviction) {
	evicted := make(chan eviction, zombieAttempts)
	return newFixture(t, Options{
		evictionMargin:       100 * time.Millisecond,
		evictionPollInterval: 25 * time.Millisecond,
		onEvict:              func(e eviction) { evicted <- e },
		Logger:               slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}), evicted
}

// TestEvictsSilentMember: a member that died while joining is removed and
// the live member gets every partition and consumes every record. In the
// runs where kfake starts no session timer for the zombie, the dev broker's
// eviction is what removes it; the test adds zombies until that happened.
func TestEvictsSilentMember(t *testing.T) {
	t.Parallel()
	f, evicted := newEvictingFixture(t)

	var ours *eviction
	for attempt := 1; attempt <= zombieAttempts && ours == nil; attempt++ {
		id := f.addZombie(t)
		ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
		_, err := f.b.cluster.WaitGroupInfo(ctx, f.group, func(g *kfake.GroupInfo) bool { return !isMember(g, id) })
		cancel()
		require.NoError(t, err, "attempt %d: zombie %s never removed", attempt, id)
		select {
		case e := <-evicted:
			require.Equal(t, id, e.MemberID)
			ours = &e
		case <-time.After(300 * time.Millisecond):
			t.Logf("attempt %d: kfake timed the zombie out itself", attempt)
		}
	}
	require.NotNil(t, ours, "kfake timed out all %d zombies itself", zombieAttempts)
	require.Equal(t, f.group, ours.Group)
	require.Equal(t, "zombie", ours.ClientID)
	require.Equal(t, zombieSession, ours.SessionTimeout)
	require.Greater(t, ours.Silent, ours.SessionTimeout)

	want := f.produceToEachPartition(t)
	got := map[string]bool{}
	for len(got) < len(want) {
		select {
		case m := <-f.msgs:
			got[string(m.Payload)] = true
			m.Ack()
		case <-time.After(15 * time.Second):
			t.Fatalf("live member got %v of %v", got, want)
		}
	}
	info := f.b.cluster.GroupInfo(f.group)
	require.Len(t, info.Members, 1)
}

// TestKfakeGapWithoutEviction documents why the eviction exists: with it
// disabled, a zombie that kfake gave no session timer keeps its partitions
// long past its session timeout, and their records are not consumed. If
// this test fails, kfake now expires such members itself and the remedy can
// go.
func TestKfakeGapWithoutEviction(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{DisableEviction: true})

	for attempt := 1; attempt <= zombieAttempts; attempt++ {
		id := f.addZombie(t)
		// Three session timeouts after it joined, is it still there?
		time.Sleep(3 * zombieSession)
		info := f.b.cluster.GroupInfo(f.group)
		if !isMember(info, id) {
			t.Logf("attempt %d: kfake timed the zombie out itself", attempt)
			continue
		}
		require.Equal(t, "Stable", info.State)
		for _, m := range info.Members {
			if m.MemberID == id {
				require.Positive(t, m.NumAssigned(), "the zombie holds partitions")
			}
		}
		want := f.produceToEachPartition(t)
		got := map[string]bool{}
		deadline := time.After(time.Second)
	loop:
		for {
			select {
			case m := <-f.msgs:
				got[string(m.Payload)] = true
				m.Ack()
			case <-deadline:
				break loop
			}
		}
		require.Less(t, len(got), len(want), "the zombie's partitions were consumed")
		return
	}
	t.Fatalf("kfake timed out all %d zombies itself: the gap is gone", zombieAttempts)
}

func TestStartValidation(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:9092", ":9092", "no-port", "[::]:1"} {
		_, err := Start(t.Context(), Options{Addr: addr})
		require.Error(t, err, addr)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := Start(ctx, Options{Addr: "127.0.0.1:0"})
	require.ErrorIs(t, err, context.Canceled)
}

// TestContextStopsBroker: Start's context ending closes the broker.
func TestContextStopsBroker(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	b, err := Start(ctx, Options{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	addr := b.Addrs()[0]
	cancel()
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			return true
		}
		_ = c.Close()
		return false
	}, 5*time.Second, 20*time.Millisecond)
	require.NoError(t, b.Close(), "Close after ctx is fine")
}

// TestDataDir: records survive a restart with the same data directory.
func TestDataDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b, err := Start(t.Context(), Options{Addr: "127.0.0.1:0", DataDir: dir})
	require.NoError(t, err)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.AllowAutoTopicCreation())
	require.NoError(t, err)
	require.NoError(t, cl.ProduceSync(t.Context(), &kgo.Record{Topic: "durable", Value: []byte("kept")}).FirstErr())
	cl.Close()
	require.NoError(t, b.Close())

	b, err = Start(t.Context(), Options{Addr: "127.0.0.1:0", DataDir: dir})
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	cl, err = kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.ConsumeTopics("durable"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	fetches := cl.PollFetches(ctx)
	require.NoError(t, fetches.Err())
	var values []string
	fetches.EachRecord(func(r *kgo.Record) { values = append(values, string(r.Value)) })
	require.Equal(t, []string{"kept"}, values)
}

// testWriter sends slog output to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestEvictsDeadMemberWhileRebalancing: a member kfake gave no session
// timer (the zombie) does not rejoin when another member joins, and kfake
// would hold the rebalance for the longest rebalance timeout (the zombie's
// 60s), restarting that timer at every further join. A real broker expires
// it once its session timeout passes; the dev broker evicts it then, while
// the group is still PreparingRebalance, and the rebalance ends without it.
func TestEvictsDeadMemberWhileRebalancing(t *testing.T) {
	t.Parallel()
	f, evicted := newEvictingFixture(t)
	const session = 2 * time.Second
	for attempt := 1; attempt <= zombieAttempts; attempt++ {
		id := f.addZombieWithSession(t, session)
		// A new member joins before the zombie's session has passed: the
		// group prepares a rebalance the zombie never rejoins.
		start := time.Now()
		cl, err := kgo.NewClient(kgo.SeedBrokers(f.b.Addrs()...), kgo.ConsumerGroup(f.group), kgo.ConsumeTopics(f.topic),
			kgo.Balancers(kgo.RangeBalancer()), kgo.SessionTimeout(3*time.Second), kgo.RebalanceTimeout(10*time.Second))
		require.NoError(t, err)
		t.Cleanup(cl.Close)
		pollCtx, stopPoll := context.WithCancel(t.Context())
		t.Cleanup(stopPoll)
		go func() {
			for pollCtx.Err() == nil {
				cl.PollFetches(pollCtx)
			}
		}()
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		_, err = f.b.cluster.WaitGroupInfo(ctx, f.group, func(g *kfake.GroupInfo) bool { return !isMember(g, id) })
		cancel()
		require.NoError(t, err, "attempt %d: zombie %s still a member 20s on (kfake holds the rebalance for 60s)", attempt, id)
		select {
		case e := <-evicted:
			if e.State != "PreparingRebalance" {
				t.Logf("attempt %d: evicted in %s, not while rebalancing; again", attempt, e.State)
				continue
			}
			require.Equal(t, id, e.MemberID)
			require.Less(t, time.Since(start), session+5*time.Second)
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
			defer cancel()
			// The rebalance ends without the zombie (the live members
			// are the fixture's and one per attempt; earlier attempts'
			// may still be settling, so their number is not checked).
			info, err := f.b.cluster.WaitGroupStable(ctx, f.group, -1)
			require.NoError(t, err, "the rebalance finished without the zombie")
			require.False(t, isMember(info, id))
			return
		case <-time.After(300 * time.Millisecond):
			t.Logf("attempt %d: kfake timed the zombie out itself", attempt)
		}
	}
	t.Fatalf("no zombie of %d was evicted while the group rebalanced", zombieAttempts)
}
