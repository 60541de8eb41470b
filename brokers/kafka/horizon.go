package kafka

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/claimtx/claimtx/brokers"
)

// ReplayHorizon reports how old a message of topic can be when Kafka still
// delivers it: the topic's retention.ms, or brokers.UnboundedHorizon when it
// keeps records forever (-1) or is compacted. A topic that does not exist
// yet reports the broker's log.retention.ms. A consumer compares it with
// its claim retention (framework/consumer's Config.Retention).
func (s *Subscriber) ReplayHorizon(ctx context.Context, topic string) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	adm, err := s.adminClient()
	if err != nil {
		return 0, err
	}
	defer adm.Close()
	rc, err := describe(adm.DescribeTopicConfigs(ctx, topic))
	if err == nil {
		return horizonOf(topic, rc.Configs, "")
	}
	// An unknown topic gets the controller's default.
	if md, merr := adm.BrokerMetadata(ctx); merr == nil {
		if rc, berr := describe(adm.DescribeBrokerConfigs(ctx, md.Controller)); berr == nil {
			return horizonOf(topic, rc.Configs, "log.")
		}
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return 0, ctxErr
	}
	return 0, fmt.Errorf("brokers/kafka: replay horizon of %q: %w", topic, err)
}

// horizonOf reads retention.ms and cleanup.policy off configs, whose keys
// carry prefix ("log." for the broker's defaults).
func horizonOf(topic string, configs []kadm.Config, prefix string) (time.Duration, error) {
	retention := brokers.UnboundedHorizon // Kafka's default is 7 days, but only a value read counts
	found := false
	for _, c := range configs {
		switch strings.TrimPrefix(c.Key, prefix) {
		case "cleanup.policy":
			if strings.Contains(c.MaybeValue(), "compact") {
				return brokers.UnboundedHorizon, nil
			}
		case "retention.ms":
			ms, err := strconv.ParseInt(c.MaybeValue(), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("brokers/kafka: replay horizon of %q: retention.ms %q: %w", topic, c.MaybeValue(), err)
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

// describe returns the one resource a describe call asked for.
func describe(rcs kadm.ResourceConfigs, err error) (kadm.ResourceConfig, error) {
	switch {
	case err != nil:
		return kadm.ResourceConfig{}, err
	case len(rcs) != 1:
		return kadm.ResourceConfig{}, errors.New("no configuration returned")
	}
	return rcs[0], rcs[0].Err
}
