package kafka_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/kafka"
)

// The subscriber joins a consumer group and consumes any record, here one
// a plain franz-go producer wrote with an event_id header: headers become
// metadata, and the adapter adds where the record was stored.
func ExampleNewSubscriber() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addrs, stop := exampleBroker() // e.g. []string{"kafka:9092"}
	defer stop()
	plainProduce(ctx, addrs, &kgo.Record{
		Topic: "orders", Key: []byte("customer-7"), Value: []byte(`{"order_id":9912}`),
		Headers: []kgo.RecordHeader{{Key: "event_id", Value: []byte("evt-42")}},
	})

	sub, err := kafka.NewSubscriber(ctx, brokers.KafkaConfig{Brokers: addrs, ConsumerGroup: "loyalty"}, nil)
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		panic(err)
	}
	m := <-msgs
	m.Ack()
	fmt.Println(string(m.Payload), m.Metadata.Get("event_id"))
	fmt.Println(m.Metadata.Get("kafka_topic"), m.Metadata.Get("kafka_offset"), m.Metadata.Get("kafka_key"))

	// The consumer group is required: two services sharing a default
	// group would split the topic between them.
	_, err = kafka.NewSubscriber(ctx, brokers.KafkaConfig{Brokers: addrs}, nil)
	fmt.Println(err)
	// Output:
	// {"order_id":9912} evt-42
	// orders 0 customer-7
	// claimtx: config field "consumer_group": must not be empty for a subscriber: set KAFKA_CONSUMER_GROUP or kafka.consumer_group to a group of this service's own (framework/consumer defaults it to the consumer's Name)
}

// The publisher is a synchronous, idempotent producer: Publish returns
// once every record was acknowledged by all in-sync replicas. Metadata
// becomes headers, the UUID one of them, and "partition_key" the record
// key, which keeps one entity's messages in one partition, in order.
func ExampleNewPublisher() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addrs, stop := exampleBroker()
	defer stop()

	pub, err := kafka.NewPublisher(ctx, brokers.KafkaConfig{Brokers: addrs}, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	msg := message.NewMessage("m1", []byte(`{"order_id":9912}`))
	msg.Metadata.Set("event_id", "evt-42")
	msg.Metadata.Set(kafka.PartitionKeyMetadata, "customer-7")
	if err := pub.Publish("orders", msg); err != nil {
		panic(err)
	}

	r := plainFetch(ctx, addrs, "orders")
	fmt.Println(string(r.Key), string(r.Value))
	headers := map[string]string{}
	for _, h := range r.Headers {
		headers[h.Key] = string(h.Value)
	}
	fmt.Println(headers["_watermill_message_uuid"], headers["event_id"])
	// Output:
	// customer-7 {"order_id":9912}
	// m1 evt-42
}

// exampleBroker starts an in-process Kafka (franz-go's kfake) that
// creates topics on first use, and returns its addresses.
func exampleBroker() ([]string, func()) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1))
	if err != nil {
		panic(err)
	}
	return c.ListenAddrs(), c.Close
}

// plainProduce writes r as a producer that knows nothing of claimtx or
// Watermill does.
func plainProduce(ctx context.Context, brokers []string, r *kgo.Record) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.AllowAutoTopicCreation())
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		panic(err)
	}
}

// plainFetch reads the first record of topic with a plain franz-go client.
func plainFetch(ctx context.Context, brokers []string, topic string) *kgo.Record {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			panic(err)
		}
		if rs := fs.Records(); len(rs) > 0 {
			return rs[0]
		}
	}
}
