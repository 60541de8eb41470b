package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Subscriber consumes with a Sarama consumer group (Config.ConsumerGroup)
// through watermill-kafka. Each partition has at most one message in flight;
// an ack marks its offset, committed every Config.CommitInterval. With
// Config.Window > 0 it consumes through its own consumer-group handler
// instead, with up to Window messages in flight per partition (window.go).
type Subscriber struct {
	cfg    Config
	sc     *sarama.Config
	logger watermill.LoggerAdapter
	sub    *wkafka.Subscriber
	closed atomic.Bool
	conn   connState // IsConnected's cached probe (health.go)

	// Window mode: closing ends every window subscription; mu orders
	// windowWG.Add in Subscribe against Close's Wait.
	mu        sync.Mutex
	closing   chan struct{}
	closeOnce sync.Once
	windowWG  sync.WaitGroup
}

var errSubscriberClosed = errors.New("subscriber closed")

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber validates cfg and returns a Subscriber. It does not
// connect, so ctx is not used yet; it is there so that both constructors
// of both adapters read alike and a later version may dial here. Each
// Subscribe call opens its own client (and retries, see
// Config.DialTimeout). A nil logger logs nothing. An invalid cfg,
// including an empty ConsumerGroup, is a *framework.ConfigError.
func NewSubscriber(ctx context.Context, cfg Config, logger watermill.LoggerAdapter) (*Subscriber, error) {
	sc, err := cfg.saramaConfig()
	if err != nil {
		return nil, err
	}
	if err := cfg.validateSubscriber(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:               cfg.Brokers,
		Unmarshaler:           marshaler{},
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         cfg.ConsumerGroup,
		NackResendSleep:       sleepSetting(cfg.NackDelay),
		ReconnectRetrySleep:   sleepSetting(cfg.ReconnectBackoff),
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("brokers/kafka: create subscriber: %w", err)
	}
	return &Subscriber{cfg: cfg, sc: sc, logger: logger, sub: sub, closing: make(chan struct{})}, nil
}

// sleepSetting maps our "negative disables" to watermill-kafka's NoSleep
// (its zero means "use the default").
func sleepSetting(d time.Duration) time.Duration {
	if d <= 0 {
		return wkafka.NoSleep
	}
	return d
}

// Subscribe joins the consumer group for topic. The first connection is
// retried until Config.DialTimeout or ctx ends; after that, watermill-kafka
// re-creates a failed consumer on its own (in window mode, the group is
// joined again every Config.ReconnectBackoff). The channel is closed when ctx
// ends or the Subscriber is closed.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.cfg.Window > 0 {
		return s.subscribeWindow(ctx, topic)
	}
	var out <-chan *message.Message
	err := retryStart(ctx, s.cfg, s.logger, fmt.Sprintf("subscribe to %q", topic), func() error {
		if s.closed.Load() {
			return errPermanent{errSubscriberClosed}
		}
		var err error
		out, err = s.sub.Subscribe(ctx, topic)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Close leaves the groups and waits for every subscription to stop. It is
// idempotent.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	s.closed.Store(true)
	s.mu.Unlock()
	s.closeOnce.Do(func() { close(s.closing) })
	err := s.sub.Close()
	s.windowWG.Wait()
	return err
}
