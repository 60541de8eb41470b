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

// groupRequestMargin is what every group request waits beyond the longest
// time the coordinator may legitimately hold its answer. franz-go waits
// RebalanceTimeout plus this overhead for a JoinGroup or SyncGroup answer
// (the Java client does the same), so a member never gives up on a join
// the coordinator is still holding for a slow peer and rejoins in a loop
// (IBM/sarama#2820, segmentio/kafka-go#510: the stall Sarama's 30 s read
// timeout caused under rolling restarts).
const groupRequestMargin = 10 * time.Second

// groupOpts returns the franz-go options of a consumer-group client for
// topic. cfg has its defaults applied and is valid. The group callbacks are
// the caller's.
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
		// The eager range protocol is what Sarama's consumer group (the
		// subscriber before this one) speaks by default: a group can be
		// rolled from one to the other without splitting in two.
		kgo.Balancers(kgo.RangeBalancer()),
		// Only offsets the subscriber marks are committed: the
		// partition's low-water mark of acked messages.
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(c.CommitInterval),
		// Rebalance callbacks never run between a poll and the hand-off
		// of its records to the partition queues (see subscriber.go).
		kgo.BlockRebalanceOnPoll(),
	}
	reset := kgo.NewOffset().AtStart()
	if c.InitialOffset == offsetNewest {
		reset = kgo.NewOffset().AtEnd()
	}
	opts = append(opts, kgo.ConsumeResetOffset(reset))
	return securityOpts(c, opts)
}

// securityOpts appends the TLS and SASL options of c to opts.
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

// kgoLogger passes franz-go's log lines to the Watermill logger: its errors
// as errors, its warnings as INFO (a rejoin, a retried request: worth
// seeing, not an alert), and the rest at DEBUG.
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
