package kafkatest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/brokers/kafka"
	"github.com/claimtx/claimtx/brokers/kafka/kafkatest"
	"github.com/claimtx/claimtx/framework/observe"
)

// A test starts a broker on a free port and points the subscriber at it;
// short session timeouts are accepted, so a test fails over quickly.
func ExampleStart() {
	ctx := context.Background()
	b, err := kafkatest.Start(ctx, kafkatest.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = b.Close() }()
	cfg := brokers.KafkaConfig{Brokers: b.Addrs(), ConsumerGroup: "loyalty", SessionTimeout: 2 * time.Second}
	sub, err := kafka.NewSubscriber(ctx, cfg, watermill.NopLogger{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = sub.Close() }()
	fmt.Println("connected:", observe.SubscriberConnected(sub)(ctx) == nil)
	// Output: connected: true
}
