package kafka

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/claimtx/claimtx/brokers"
)

// ReplayHorizon reports how old a message of topic can be when Kafka still
// delivers it: the topic's retention.ms, or brokers.UnboundedHorizon when
// the topic keeps records forever (retention.ms -1) or is compacted
// (cleanup.policy contains compact: the latest record of each key stays).
// A consumer compares it with its claim retention: a record older than the
// retention whose claim cleanup removed would be applied again (see
// framework/consumer's Config.Retention). A topic that does not exist yet
// reports the broker's default for new topics, log.retention.ms.
func (s *Subscriber) ReplayHorizon(ctx context.Context, topic string) (time.Duration, error) {
	type result struct {
		d   time.Duration
		err error
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	done := make(chan result, 1)
	// sarama's admin calls take no context: an abandoned call ends by
	// itself within the Sarama timeouts (brokers.KafkaConfig.DialTimeout).
	go func() {
		d, err := s.replayHorizon(topic)
		done <- result{d, err}
	}()
	select {
	case r := <-done:
		return r.d, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (s *Subscriber) replayHorizon(topic string) (time.Duration, error) {
	admin, err := sarama.NewClusterAdmin(s.cfg.Brokers, s.sc)
	if err != nil {
		return 0, fmt.Errorf("brokers/kafka: replay horizon of %q: %w", topic, err)
	}
	defer func() { _ = admin.Close() }()
	entries, err := describe(admin, sarama.ConfigResource{Type: sarama.TopicResource, Name: topic, ConfigNames: []string{"retention.ms", "cleanup.policy"}})
	if err != nil {
		// An unknown topic: what the broker gives a new one.
		return brokerDefaultHorizon(admin, topic, err)
	}
	return horizonOf(topic, entries)
}

// brokerDefaultHorizon reads log.retention.ms of the controller, which a
// topic created without its own retention.ms inherits.
func brokerDefaultHorizon(admin sarama.ClusterAdmin, topic string, topicErr error) (time.Duration, error) {
	_, id, err := admin.DescribeCluster()
	if err != nil {
		return 0, fmt.Errorf("brokers/kafka: replay horizon of %q: %w", topic, topicErr)
	}
	entries, err := describe(admin, sarama.ConfigResource{Type: sarama.BrokerResource, Name: strconv.Itoa(int(id)), ConfigNames: []string{"log.retention.ms", "log.cleanup.policy"}})
	if err != nil {
		return 0, fmt.Errorf("brokers/kafka: replay horizon of %q: %w", topic, topicErr)
	}
	for i := range entries {
		entries[i].Name = strings.TrimPrefix(entries[i].Name, "log.")
	}
	return horizonOf(topic, entries)
}

func horizonOf(topic string, entries []sarama.ConfigEntry) (time.Duration, error) {
	retention := brokers.UnboundedHorizon // Kafka's default is 7 days, but only a value read counts
	found := false
	for _, e := range entries {
		switch e.Name {
		case "cleanup.policy":
			if strings.Contains(e.Value, "compact") {
				return brokers.UnboundedHorizon, nil
			}
		case "retention.ms":
			ms, err := strconv.ParseInt(e.Value, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("brokers/kafka: replay horizon of %q: retention.ms %q: %w", topic, e.Value, err)
			}
			found = true
			if ms >= 0 && ms < math.MaxInt64/int64(time.Millisecond) {
				retention = time.Duration(ms) * time.Millisecond
			}
		}
	}
	if !found {
		return 0, fmt.Errorf("brokers/kafka: replay horizon of %q: the broker reported no retention.ms", topic)
	}
	return retention, nil
}

// describe returns the config entries of one resource, or its error.
func describe(admin sarama.ClusterAdmin, r sarama.ConfigResource) ([]sarama.ConfigEntry, error) {
	results, err := admin.DescribeConfigs([]*sarama.ConfigResource{&r}, sarama.DescribeConfigsOptions{})
	if err != nil {
		return nil, err
	}
	for _, res := range results {
		if res.Name != r.Name {
			continue
		}
		if res.ErrorCode != sarama.ErrNoError {
			return nil, &sarama.DescribeConfigError{Err: res.ErrorCode, ErrMsg: res.ErrorMsg}
		}
		return res.Configs, nil
	}
	return nil, fmt.Errorf("no configuration returned for %q", r.Name)
}
