package kafkatest

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Options configures Start. The zero value is usable.
type Options struct {
	// Addr is the host:port to listen on, and what the broker advertises, so
	// the host must be one clients can reach (not "0.0.0.0"). Defaults to
	// "127.0.0.1:0", a free port (Broker.Addrs tells it).
	Addr string

	// DataDir, when set, keeps topics, records, offsets and group state in
	// this directory across Starts. Defaults to "": in memory.
	DataDir string

	// GroupMinSessionTimeout is the smallest session timeout the broker
	// accepts (group.min.session.timeout.ms; Kafka: 6s), so tests can fail
	// over fast. Defaults to 100ms.
	GroupMinSessionTimeout time.Duration

	// Partitions is the partition count of auto-created topics (default 10).
	Partitions int

	// DisableAutoCreateTopics makes the broker refuse to create topics on
	// first use.
	DisableAutoCreateTopics bool

	// DisableEviction turns off the silent-member eviction (package
	// documentation).
	DisableEviction bool

	// Logger receives kfake's warnings and errors and one Info line per
	// eviction; kfake's per-connection chatter goes to Debug. Defaults to
	// discarding everything.
	Logger *slog.Logger

	// Knobs for this package's own tests.
	evictionMargin       time.Duration // added to a member's session timeout; 1s
	evictionPollInterval time.Duration // how often groups are checked; 250ms
	onEvict              func(eviction)
}

func (o Options) withDefaults() Options {
	// As the fields document them (and framework/cmd/devkafka's flags repeat).
	o.Addr = cmp.Or(o.Addr, "127.0.0.1:0")
	o.GroupMinSessionTimeout = cmp.Or(o.GroupMinSessionTimeout, 100*time.Millisecond)
	o.Partitions = cmp.Or(o.Partitions, 10)
	o.evictionMargin = cmp.Or(o.evictionMargin, time.Second)
	o.evictionPollInterval = cmp.Or(o.evictionPollInterval, 250*time.Millisecond)
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return o
}

// Broker is a running in-process broker.
type Broker struct {
	cluster *kfake.Cluster
	logger  *slog.Logger
	ev      *evictor

	stop      context.CancelFunc
	done      chan struct{} // closed when the eviction loop has exited
	closeOnce sync.Once
}

// Start starts the broker and returns once it accepts connections. It runs
// until Close is called or ctx ends.
func Start(ctx context.Context, opts Options) (*Broker, error) {
	opts = opts.withDefaults() // fills zero fields only: a bad value still fails
	host, _, err := net.SplitHostPort(opts.Addr)
	ip := net.ParseIP(host)
	switch {
	case err != nil:
		return nil, fmt.Errorf("kafkatest: Addr %q is not host:port: %w", opts.Addr, err)
	case host == "" || (ip != nil && ip.IsUnspecified()):
		return nil, fmt.Errorf("kafkatest: Addr %q: the host is advertised to clients, so it must be a reachable address, not a wildcard", opts.Addr)
	case opts.GroupMinSessionTimeout < 0:
		return nil, fmt.Errorf("kafkatest: GroupMinSessionTimeout must not be negative, got %s", opts.GroupMinSessionTimeout)
	case opts.Partitions < 0:
		return nil, fmt.Errorf("kafkatest: Partitions must be positive, got %d", opts.Partitions)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	kopts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.ClusterID("claimtx-kafkatest"),
		// kfake always asks for 127.0.0.1:<port>; we listen where we were told.
		kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, opts.Addr) }),
		kfake.GroupMinSessionTimeout(opts.GroupMinSessionTimeout),
		kfake.DefaultNumPartitions(opts.Partitions),
		kfake.WithLogger(slogAdapter{opts.Logger}),
	}
	if !opts.DisableAutoCreateTopics {
		kopts = append(kopts, kfake.AllowAutoTopicCreation())
	}
	if opts.DataDir != "" {
		kopts = append(kopts, kfake.DataDir(opts.DataDir))
	}
	cluster, err := kfake.NewCluster(kopts...)
	if err != nil {
		return nil, fmt.Errorf("kafkatest: start on %s: %w", opts.Addr, err)
	}

	runCtx, stop := context.WithCancel(ctx)
	b := &Broker{cluster: cluster, logger: opts.Logger, stop: stop, done: make(chan struct{})}

	if !opts.DisableEviction {
		client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ClientID("claimtx-kafkatest-evictor"))
		if err != nil {
			stop()
			cluster.Close()
			return nil, fmt.Errorf("kafkatest: eviction client: %w", err)
		}
		b.ev = &evictor{cluster: cluster, client: client, opts: opts, groups: make(map[string]*groupTrack)}
		b.ev.observe()
	}
	go func() {
		if b.ev != nil {
			b.ev.run(runCtx)
		}
		<-runCtx.Done()
		close(b.done)
		_ = b.Close() // when ctx ended
	}()

	opts.Logger.Info("kafkatest: broker started", "addrs", cluster.ListenAddrs(), "data_dir", opts.DataDir)
	return b, nil
}

// Addrs returns the addresses the broker listens on (one).
func (b *Broker) Addrs() []string { return b.cluster.ListenAddrs() }

// Close stops the broker: with a DataDir, it saves its state first. It is
// idempotent and safe to call from several goroutines.
func (b *Broker) Close() error {
	b.closeOnce.Do(func() {
		b.stop()
		<-b.done // kfake's GroupInfo blocks forever on a closed cluster
		if b.ev != nil {
			b.ev.client.Close()
		}
		b.cluster.Close()
		b.logger.Info("kafkatest: broker stopped")
	})
	return nil
}

// slogAdapter sends kfake's logs to slog.
type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Logf(level kfake.LogLevel, format string, args ...any) {
	var l slog.Level
	switch level {
	case kfake.LogLevelError:
		l = slog.LevelError
	case kfake.LogLevelWarn:
		l = slog.LevelWarn
	case kfake.LogLevelInfo:
		// kfake logs every dropped client connection at Info.
		l = slog.LevelDebug
	default:
		l = slog.LevelDebug - 4
	}
	ctx := context.Background()
	if !a.l.Enabled(ctx, l) {
		return
	}
	a.l.Log(ctx, l, "kfake: "+fmt.Sprintf(format, args...))
}
