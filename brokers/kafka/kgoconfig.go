package kafka

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/claimtx/claimtx/brokers"
)

// groupRequestMargin is what a JoinGroup or SyncGroup waits beyond
// RebalanceTimeout, as the Java client does, so a member never gives up on
// a join the coordinator still holds for a slow peer and rejoins in a loop
// (IBM/sarama#2820: the stall under rolling restarts).
const groupRequestMargin = 10 * time.Second

// groupOpts returns the franz-go options of a consumer-group client for
// topic, without the group callbacks; c has its defaults and is valid.
func groupOpts(c brokers.KafkaConfig, topic string) ([]kgo.Opt, error) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.ClientID(c.ClientID),
		kgo.ConsumerGroup(c.ConsumerGroup),
		kgo.ConsumeTopics(topic),
		kgo.FetchMaxWait(c.MaxWaitTime),
		kgo.SessionTimeout(c.SessionTimeout),
		kgo.HeartbeatInterval(c.HeartbeatInterval),
		kgo.RebalanceTimeout(c.RebalanceTimeout),
		kgo.RequestTimeoutOverhead(groupRequestMargin),
		// Sarama's default: a group rolls over from the old subscriber.
		kgo.Balancers(kgo.RangeBalancer()),
		kgo.AutoCommitMarks(), // the acked low-water mark only
		kgo.AutoCommitInterval(c.CommitInterval),
		kgo.BlockRebalanceOnPoll(),
	}
	reset := kgo.NewOffset().AtStart()
	if c.InitialOffset == offsetNewest {
		reset = kgo.NewOffset().AtEnd()
	}
	opts = append(opts, kgo.ConsumeResetOffset(reset))
	return securityOpts(c, opts)
}

func securityOpts(c brokers.KafkaConfig, opts []kgo.Opt) ([]kgo.Opt, error) {
	if c.TLS.Enabled {
		tc, err := tlsConfig(c.TLS)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	switch c.SASL.Mechanism {
	case saslPlain:
		opts = append(opts, kgo.SASL(plain.Auth{User: c.SASL.User, Pass: c.SASL.Password}.AsMechanism()))
	case saslScramSHA256:
		opts = append(opts, kgo.SASL(scram.Auth{User: c.SASL.User, Pass: c.SASL.Password}.AsSha256Mechanism()))
	case saslScramSHA512:
		opts = append(opts, kgo.SASL(scram.Auth{User: c.SASL.User, Pass: c.SASL.Password}.AsSha512Mechanism()))
	}
	return opts, nil
}

// kgoLogger passes franz-go's log lines on: warnings (a rejoin, a retried
// request) at INFO, as they are no alert, and INFO at DEBUG.
type kgoLogger struct {
	logger watermill.LoggerAdapter
	fields watermill.LogFields
}

func (kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelInfo }

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	fields := l.fields.Copy()
	for i := 0; i+1 < len(keyvals); i += 2 {
		fields[fmt.Sprint(keyvals[i])] = keyvals[i+1]
	}
	switch level {
	case kgo.LogLevelError:
		err, ok := fields["err"].(error)
		if !ok {
			err = errors.New(msg)
		}
		l.logger.Error("kafka client: "+msg, err, fields)
	case kgo.LogLevelWarn:
		l.logger.Info("kafka client: "+msg, fields)
	default:
		l.logger.Debug("kafka client: "+msg, fields)
	}
}
