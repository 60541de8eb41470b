package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/internal/kafkarecord"
	"github.com/claimtx/claimtx/store"
)

// positionLag is one stored Kafka position with the partition's end offset
// and the records past the position (not settled yet), when the broker
// could be asked.
type positionLag struct {
	store.KafkaPosition
	EndOffset *int64 `json:"end_offset,omitempty"`
	Lag       *int64 `json:"lag,omitempty"`
}

// withoutLags is ps with the lags unknown.
func withoutLags(ps []store.KafkaPosition) []positionLag {
	out := make([]positionLag, len(ps))
	for i, p := range ps {
		out[i].KafkaPosition = p
	}
	return out
}

// positionLags adds the end offsets and lags to ps when the broker of cfg
// is Kafka; a failure is returned as a note, not an error: the positions
// come from the database and stand on their own.
func positionLags(ctx context.Context, cfg brokers.Config, ps []store.KafkaPosition) ([]positionLag, string) {
	out := withoutLags(ps)
	if len(ps) == 0 {
		return out, ""
	}
	if cfg.Kind != brokers.KindKafka {
		return out, "lag unknown"
	}
	if cfg.Kafka.ConsumerGroup == "" {
		cfg.Kafka.ConsumerGroup = "claimtx-stats" // a subscriber needs one; it never joins
	}
	sub, err := brokers.NewSubscriber(cfg, nil)
	if err != nil {
		return out, fmt.Sprintf("lag unknown: %v", err)
	}
	defer func() { _ = sub.Close() }()
	endOffsets, ok := kafkarecord.EndOffsets(sub)
	if !ok {
		return out, ""
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ends := map[string]map[int32]int64{}
	for i := range out {
		topic := out[i].Topic
		if _, done := ends[topic]; !done {
			e, err := endOffsets(ctx, topic)
			if err != nil {
				return out, fmt.Sprintf("lag unknown: %v", err)
			}
			ends[topic] = e
		}
		if end, ok := ends[topic][out[i].Partition]; ok {
			lag := max(end-out[i].SettledBelow, 0)
			out[i].EndOffset, out[i].Lag = &end, &lag
		}
	}
	return out, ""
}

// printPositions prints the stored Kafka positions, with the lag when
// known.
func printPositions(w io.Writer, ps []positionLag, note string) {
	if len(ps) == 0 {
		return
	}
	printf(w, "kafka positions stored with the claims (every record below SETTLED_BELOW is settled)\n")
	tw := newTable(w)
	printlnTo(tw, "CONSUMER\tTOPIC\tPARTITION\tSETTLED_BELOW\tEND\tLAG\tUPDATED")
	for _, p := range ps {
		end, lag := "?", "?"
		if p.EndOffset != nil {
			end, lag = fmt.Sprint(*p.EndOffset), fmt.Sprint(*p.Lag)
		}
		printf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", p.Consumer, p.Topic, p.Partition, p.SettledBelow, end, lag, p.UpdatedAt.UTC().Format(time.RFC3339))
	}
	_ = tw.Flush()
	if note != "" {
		printf(w, "%s (END and LAG need --broker kafka and --kafka-brokers, or BROKER and KAFKA_BROKERS)\n", note)
	}
}
