package main

import (
	"context"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/examples/loyalty/feed"
)

// kafkaOps publishes like a plain franz-go producer (kafkaRecord).
type kafkaOps struct {
	addr, topic string
	group       string
	cl          *kgo.Client
	adm         *kadm.Client
}

const partitions = 4

func (k *kafkaOps) prepare(ctx context.Context) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.addr), kgo.ProducerLinger(0))
	if err != nil {
		return err
	}
	k.cl, k.adm = cl, kadm.NewClient(cl)
	return feed.CreateKafkaTopics(ctx, k.adm, k.topic, partitions)
}

func (k *kafkaOps) publish(ctx context.Context, ds []delivery) error {
	recs := make([]*kgo.Record, len(ds))
	for i, d := range ds {
		recs[i] = feed.KafkaRecord(k.topic, d.eventID, d.payload)
	}
	return k.cl.ProduceSync(ctx, recs...).FirstErr()
}

// drained reports that the consumer group's committed offsets reached the
// end of every partition.
func (k *kafkaOps) drained(ctx context.Context) (bool, error) {
	lags, err := k.adm.Lag(ctx, k.group)
	if err != nil {
		return false, err
	}
	l, ok := lags[k.group]
	if !ok || l.Error() != nil {
		return false, nil
	}
	total, seen := int64(0), 0
	for _, p := range l.Lag[k.topic] {
		if p.Err != nil || p.Commit.At < 0 {
			return false, nil
		}
		total += p.Lag
		seen++
	}
	return seen == partitions && total == 0, nil
}

func (k *kafkaOps) poisoned(ctx context.Context) (int, error) {
	return feed.KafkaTopicSize(ctx, k.adm, k.topic+".poison")
}

func (k *kafkaOps) close() {
	if k.cl != nil {
		k.cl.Close()
	}
}
