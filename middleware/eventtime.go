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

// readsBrokerTime reports whether f finds an event time in a message that
// carries nothing a producer fixed: no payload, no metadata but the record
// timestamp the Kafka adapter sets on consume. Asking the function itself
// covers every way of reading that timestamp ("kafka:timestamp",
// "metadata:kafka_timestamp", a user's TimeFunc falling back to it), and
// also a TimeFunc that reads the clock, which is no more stable. A
// producer-fixed extractor fails on the probe because its field is
// missing. A TimeFunc that panics on it cannot be judged and is accepted:
// the router's Recoverer deals with it on real messages.
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
