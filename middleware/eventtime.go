package middleware

import (
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/kafkarecord"
)

// brokerEventTimeRisk is why NewClaim refuses an EventTime that
// readsBrokerTime, unless AllowBrokerEventTime is set.
const brokerEventTimeRisk = "reads a time the broker or the publishing client assigns to each copy " +
	"(such as kafka:timestamp), not one the producer fixed: a copy written again " +
	"(a dead-letter replay, a mirror, a topic with LogAppendTime, any producer other than claimtx's Kafka publisher) " +
	"can carry another day, miss its claim in that day's partition and be applied twice; " +
	"use a producer field (metadata:event_time, json:occurred_at) or set AllowBrokerEventTime to accept that risk"

// readsBrokerTime reports whether f finds an event time in a message with
// nothing a producer fixed, only the Kafka record timestamp: that catches
// every way of reading it, and a TimeFunc reading the clock. A TimeFunc
// that panics cannot be judged and is accepted (Recoverer deals with it).
func readsBrokerTime(f framework.TimeFunc) (broker bool) {
	defer func() {
		if recover() != nil {
			broker = false
		}
	}()
	probe := message.NewMessage("claimtx-event-time-probe", nil)
	probe.Metadata.Set(kafkarecord.KafkaTimestamp, "2001-02-03T04:05:06.789Z")
	_, err := f(probe)
	return err == nil
}
