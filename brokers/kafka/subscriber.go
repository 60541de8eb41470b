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
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/internal/kafkarecord"
)

// Subscriber consumes with a franz-go consumer group (brokers.KafkaConfig.ConsumerGroup).
// Each partition has at most brokers.KafkaConfig.Window messages in flight (one by
// default); an ack marks its offset once every earlier message of the
// partition is acked, and marks are committed every brokers.KafkaConfig.CommitInterval
// (group.go has the details).
type Subscriber struct {
	cfg    brokers.KafkaConfig
	sc     *sarama.Config // readiness probe and credential check (health.go, auth.go)
	logger watermill.LoggerAdapter
	closed atomic.Bool
	conn   connState // IsConnected's cached probe (health.go)

	positions kafkarecord.Options // stored positions, attached before Subscribe (positions.go)

	// Closing ends every subscription; mu orders subs.Add in Subscribe
	// against Close's Wait.
	mu        sync.Mutex
	closing   chan struct{}
	closeOnce sync.Once
	subs      sync.WaitGroup
}

var errSubscriberClosed = errors.New("subscriber closed")

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber validates cfg and returns a Subscriber. It does not
// connect, so ctx is not used yet; it is there so that both constructors
// of both adapters read alike and a later version may dial here. Each
// Subscribe call opens its own client (and retries, see
// brokers.KafkaConfig.DialTimeout). A nil logger logs nothing. An invalid cfg,
// including an empty ConsumerGroup, is a *framework.ConfigError.
func NewSubscriber(ctx context.Context, cfg brokers.KafkaConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	sc, err := saramaConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := validateSubscriber(cfg); err != nil {
		return nil, err
	}
	cfg = withDefaults(cfg)
	if _, err := groupOpts(cfg, "validate"); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Subscriber{cfg: cfg, sc: sc, logger: logger, closing: make(chan struct{})}, nil
}

// Subscribe joins the consumer group for topic. The first contact with the
// cluster is retried until brokers.KafkaConfig.DialTimeout or ctx ends; after that, the
// client reconnects and rejoins on its own. The channel is closed when ctx
// ends or the Subscriber is closed.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("brokers/kafka: subscribe to %q: %w", topic, errSubscriberClosed)
	}
	return s.subscribe(ctx, topic)
}

// closeWait bounds Close's wait for the subscriptions: each ends within
// closeTimeout once its consumer let go of the messages it holds.
const closeWait = closeTimeout + time.Second

// Close ends every subscription: it stops forwarding, commits the offsets
// of acked messages, leaves the group and waits for the subscriptions to
// close their channels, at most 6 s (a cluster that does not answer
// cannot hold it longer; what was not committed is delivered again). It is
// idempotent.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	s.closed.Store(true)
	s.mu.Unlock()
	s.closeOnce.Do(func() { close(s.closing) })
	done := make(chan struct{})
	go func() {
		s.subs.Wait()
		close(done)
	}()
	t := time.NewTimer(closeWait)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return fmt.Errorf("brokers/kafka: subscriptions still closing after %s; going on without them (what they did not commit is delivered again)", closeWait)
	}
}
