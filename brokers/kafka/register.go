package kafka

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/kafkarecord"
)

// Importing the package registers the "kafka" kind: a program that never
// imports it links neither Sarama nor franz-go. brokers.Config.Validate
// checks the kafka section, so there is no Validate here.
func init() {
	brokers.Register(brokers.KindKafka, brokers.Factory{
		NewSubscriber: func(c brokers.Config, l watermill.LoggerAdapter) (message.Subscriber, error) {
			sub, err := NewSubscriber(context.Background(), c.Kafka, l)
			return sub, inSection(err) // a missing consumer group is only found here
		},
		NewPublisher: func(c brokers.Config, l watermill.LoggerAdapter) (message.Publisher, error) {
			pub, err := NewPublisher(context.Background(), c.Kafka, l)
			return pub, inSection(err) // e.g. an unreadable KAFKA_TLS_CA_FILE
		},
	})
	kafkarecord.Register(kafkarecord.Adapter{
		Attach: attach,
		EndOffsets: func(sub any) (kafkarecord.EndOffsetsFunc, bool) {
			if s, ok := sub.(*subscriber); ok {
				return s.endOffsets, true
			}
			return nil, false
		},
	})
}

// inSection (nil for nil) names a field of err by its path in a brokers.Config
// ("kafka.consumer_group"), as brokers.Config.Validate names the others.
func inSection(err error) error {
	var ce *framework.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	out := *ce
	out.Field = brokers.KindKafka + "." + ce.Field
	return &out
}
