package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/internal/defaults"
	"github.com/claimtx/claimtx/framework"
)

type publisher struct {
	mu     sync.RWMutex // watermill-kafka's closed flag is a plain bool
	closed bool
	pub    *wkafka.Publisher
}

// NewPublisher validates cfg and connects the producer, retrying until
// DialTimeout passes or ctx ends (ctx bounds the start-up only). A nil
// logger logs nothing. An invalid cfg (an unreadable TLS file too) is a
// *framework.ConfigError. The publisher produces with a Sarama sync
// producer (acks=all, idempotent): Publish returns once every message is
// written.
func NewPublisher(ctx context.Context, cfg brokers.KafkaConfig, logger watermill.LoggerAdapter) (message.Publisher, error) {
	sc, err := saramaConfig(cfg)
	if err != nil {
		return nil, err
	}
	cfg = defaults.Apply(cfg)
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
	return &publisher{pub: pub}, nil
}

// Publish writes messages to topic in order and waits for all in-sync
// replicas. A message Kafka will never take as it is (see refused) fails
// with a framework.Permanent error.
func (p *publisher) Publish(topic string, messages ...*message.Message) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errors.New("brokers/kafka: publisher closed")
	}
	if err := p.pub.Publish(topic, messages...); err != nil {
		err = fmt.Errorf("brokers/kafka: publish to %q: %w", topic, err)
		if refused(err) {
			return framework.Permanent(err)
		}
		return err
	}
	return nil
}

// refused reports whether a publish failed because of the message or a
// standing rule (size, validity, authorization, policy, topic name), so
// that publishing it again cannot succeed.
func refused(err error) bool {
	var ke sarama.KError
	if errors.As(err, &ke) {
		switch ke {
		case sarama.ErrMessageSizeTooLarge, sarama.ErrMessageSetSizeTooLarge, sarama.ErrInvalidMessage,
			sarama.ErrInvalidRecord, sarama.ErrTopicAuthorizationFailed, sarama.ErrClusterAuthorizationFailed,
			sarama.ErrPolicyViolation, sarama.ErrInvalidTopic:
			return true
		}
	}
	// Sarama's own size check, before anything is sent.
	var ce sarama.ConfigurationError
	return errors.As(err, &ce) && strings.Contains(string(ce), "larger than configured Producer.MaxMessageBytes")
}

// Close flushes and closes the producer. It is idempotent.
func (p *publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return p.pub.Close()
}
