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
	"github.com/claimtx/claimtx/framework"
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
// broker is reachable until brokers.KafkaConfig.DialTimeout passes or ctx ends. ctx
// bounds the start-up only, not the Publisher's life. A nil logger logs
// nothing. An invalid cfg (including an unreadable TLS file) is a
// *framework.ConfigError.
func NewPublisher(ctx context.Context, cfg brokers.KafkaConfig, logger watermill.LoggerAdapter) (*Publisher, error) {
	sc, err := saramaConfig(cfg)
	if err != nil {
		return nil, err
	}
	cfg = withDefaults(cfg)
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
// when the cluster allows auto-creation. A message Kafka will never take
// as it is (see refused: over the producer's or the topic's size limit,
// not authorized, refused by policy) fails with a framework.Permanent
// error.
func (p *Publisher) Publish(topic string, messages ...*message.Message) error {
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
// standing rule, so that publishing it again cannot succeed: larger than
// Producer.MaxMessageBytes (1 MiB; Sarama checks before sending) or the
// topic's max.message.bytes, not a valid record, a topic or cluster the
// principal may not write to, a policy violation, an invalid topic name.
// Anything else (a leader election, a broker down, a timeout) may pass on
// a later attempt, which Sarama's own retries have not made yet.
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
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return p.pub.Close()
}
