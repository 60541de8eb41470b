package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers/internal/wait"
	"github.com/claimtx/claimtx/internal/kafkarecord"
)

// Subscriber consumes with a franz-go consumer group (Config.ConsumerGroup).
// Each partition has at most Config.Window messages in flight (one by
// default); an ack marks its offset once every earlier message of the
// partition is acked, and marks are committed every Config.CommitInterval
// (group.go has the details).
type Subscriber struct {
	cfg    Config
	sc     *sarama.Config // readiness probe and credential check (health.go, auth.go)
	logger watermill.LoggerAdapter
	conn   connState // IsConnected's cached probe (health.go)

	positions kafkarecord.Options // stored positions, attached before Subscribe (positions.go)

	// life ends when Close starts, and with it every subscription; mu
	// orders subs.Add in Subscribe against Close's Wait.
	mu   sync.Mutex
	life context.Context
	end  context.CancelFunc
	subs sync.WaitGroup
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
	life, end := context.WithCancel(context.Background())
	return &Subscriber{cfg: cfg, sc: sc, logger: logger, life: life, end: end}, nil
}

// closed reports whether Close has begun.
func (s *Subscriber) closed() bool { return s.life.Err() != nil }

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
	s.end()
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.subs.Wait()
		close(done)
	}()
	if wait.For(closeWait, done) {
		return fmt.Errorf("brokers/kafka: subscriptions still closing after %s; going on without them (what they did not commit is delivered again)", closeWait)
	}
	return nil
}
