package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Publisher produces with a Sarama sync producer (acks=all, idempotent):
// Publish returns once every message is written.
type Publisher struct {
	// mu makes Close safe against concurrent Publish calls:
	// watermill-kafka's Publisher keeps its closed flag in a plain bool.
	mu     sync.RWMutex
	closed bool
	pub    *wkafka.Publisher
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher validates cfg and connects the producer, retrying while no
// broker is reachable until Config.DialTimeout passes or ctx ends. ctx
// bounds the start-up only, not the Publisher's life. A nil logger logs
// nothing. An invalid cfg (including an unreadable TLS file) is a
// *framework.ConfigError.
func NewPublisher(ctx context.Context, cfg Config, logger watermill.LoggerAdapter) (*Publisher, error) {
	sc, err := cfg.saramaConfig()
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	var pub *wkafka.Publisher
	err = retryStart(ctx, cfg, logger, "connect producer", func() error {
		var err error
		pub, err = wkafka.NewPublisher(wkafka.PublisherConfig{
			Brokers:               cfg.Brokers,
			Marshaler:             marshaler{},
			OverwriteSaramaConfig: sc,
		}, logger)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Publisher{pub: pub}, nil
}

// Publish writes messages to topic in order and waits for each to be
// acknowledged by all in-sync replicas. Topics are created on first use
// when the cluster allows auto-creation.
func (p *Publisher) Publish(topic string, messages ...*message.Message) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errors.New("brokers/kafka: publisher closed")
	}
	if err := p.pub.Publish(topic, messages...); err != nil {
		return fmt.Errorf("brokers/kafka: publish to %q: %w", topic, err)
	}
	return nil
}

// Close flushes and closes the producer. It is idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return p.pub.Close()
}
