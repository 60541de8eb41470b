package middleware

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/poisonmeta"
	"github.com/claimtx/claimtx/store"
)

// PoisonReasonKey is the metadata key of a poisoned copy that holds the
// error text that poisoned the message.
const PoisonReasonKey = poisonmeta.Reason

// Poison routes messages that cannot be processed to a poison/dead-letter
// topic with the reason, then lets the router ack the original. Nothing is
// acked without either an effect, a recorded duplicate, or a copy in the
// poison topic: if publishing the copy fails, the original is nacked.
//
// Put it before Retry: Retry bounds the attempts of failing handlers, Poison
// catches what is left. What is poisoned is fixed, so that no message is
// silently acked or redelivered forever: permanent errors
// (framework.Permanent, a bad key) and every error that is not a transient
// database failure. Transient database failures (the database is down) are
// nacked instead, so a database outage does not dead-letter every message
// in flight.
//
// Interrupted work is never poisoned: when the message's context has
// ended (the router or the subscription is shutting down, a rolling
// deploy's SIGTERM), the failure says nothing about the message, so the
// error is returned and the router nacks it; the broker redelivers it to
// a consumer that is not stopping.
//
// A poisoned copy carries the original payload and metadata, and:
//
//	claimtx_poison_reason     the error text (PoisonReasonKey)
//	claimtx_poison_permanent  "true" when the error was permanent (bad key,
//	                          undecodable payload), "false" when retries
//	                          were exhausted
//	claimtx_poison_consumer   Consumer, when set
//	claimtx_poison_key        the claim key from Key, when set and the key
//	                          could be derived
//	claimtx_poisoned_at       when the copy was made: RFC 3339, UTC, with
//	                          nine fraction digits
//
// besides Watermill's own reason_poisoned / topic_poisoned /
// handler_poisoned / subscriber_poisoned keys, so Watermill tooling reads
// them. `claimtx dlq` reads them to list, classify and replay the
// destination, and a replay removes exactly these keys again.
type Poison struct {
	// Publisher publishes the poisoned copies. Required.
	Publisher message.Publisher
	// Topic is the poison topic (for RabbitMQ, a durable queue of that
	// name). Required.
	Topic string
	// OnPoison, when set, is called after a copy was published.
	OnPoison func(msg *message.Message, err error)
	// Consumer is the consumer name stamped on each copy
	// ("claimtx_poison_consumer"), so a poison destination that several
	// consumers of one topic share tells whose copy each is.
	// framework/consumer sets it to Config.Name. Defaults to "": not
	// stamped.
	Consumer string
	// Key derives the claim key stamped on each copy
	// ("claimtx_poison_key"); nothing is stamped when it fails, which is
	// often why the message was poisoned. framework/consumer sets it to
	// the claim's key function under the claim's KeyPolicy. Defaults to
	// nil: not stamped.
	Key framework.KeyFunc
	// SourceTopic is stamped as Watermill's "topic_poisoned" when the
	// message's context does not name the topic it was consumed from,
	// which is the case outside a Watermill router (the batch consumer
	// sets it). A replay sends the copy back to that topic. Defaults to
	// "".
	SourceTopic string
}

// shouldPoison is the fixed policy of Poison: permanent errors and every
// error that is not a transient database failure.
func shouldPoison(err error) bool {
	return framework.IsPermanent(err) || !store.IsTransient(err)
}

// validate reports the first invalid field.
func (p Poison) validate() error {
	if p.Publisher == nil {
		return &framework.ConfigError{Field: "Publisher", Reason: "must not be nil"}
	}
	if p.Topic == "" {
		return &framework.ConfigError{Field: "Topic", Reason: "must not be empty"}
	}
	return nil
}

// NewPoison validates p and returns its middleware. A configuration error
// is returned here, so a poison route that cannot publish (every failing
// message nacked forever) cannot be installed.
func NewPoison(p Poison) (message.HandlerMiddleware, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	return p.middleware, nil
}

func (p Poison) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil || msg.Context().Err() != nil || !shouldPoison(err) {
			return out, err
		}
		cp := p.copyWithReason(msg, err)
		if perr := p.Publisher.Publish(p.Topic, cp); perr != nil {
			return nil, errors.Join(err, fmt.Errorf("claimtx: publish to poison topic %q: %w", p.Topic, perr))
		}
		if p.OnPoison != nil {
			p.OnPoison(msg, err)
		}
		return nil, nil
	}
}

// copyWithReason is the poisoned copy of msg, stamped as the type
// documentation describes.
func (p Poison) copyWithReason(msg *message.Message, err error) *message.Message {
	cp := msg.Copy()
	// A copy of a copy (poisoned, replayed by hand without cleaning,
	// poisoned again) must not keep the earlier stamps.
	for k := range cp.Metadata {
		if poisonmeta.IsPoisonKey(k) {
			delete(cp.Metadata, k)
		}
	}
	reason := err.Error()
	cp.Metadata.Set(poisonmeta.Reason, reason)
	cp.Metadata.Set(poisonmeta.Permanent, fmt.Sprint(framework.IsPermanent(err)))
	cp.Metadata.Set(poisonmeta.PoisonedAt, poisonmeta.FormatTime(time.Now()))
	if p.Consumer != "" {
		cp.Metadata.Set(poisonmeta.Consumer, p.Consumer)
	}
	if key, ok := p.key(msg); ok {
		cp.Metadata.Set(poisonmeta.Key, key)
	}
	topic := message.SubscribeTopicFromCtx(msg.Context())
	if topic == "" {
		topic = p.SourceTopic
	}
	cp.Metadata.Set(poisonmeta.WatermillReason, reason)
	cp.Metadata.Set(poisonmeta.WatermillTopic, topic)
	cp.Metadata.Set(poisonmeta.WatermillHandler, message.HandlerNameFromCtx(msg.Context()))
	cp.Metadata.Set(poisonmeta.WatermillSubscriber, message.SubscriberNameFromCtx(msg.Context()))
	return cp
}

// key derives msg's claim key with p.Key. A key function that panics on
// this message (the panic may be why it is being poisoned) stamps no key:
// the copy must still be published, or the message would be nacked and
// come back forever.
func (p Poison) key(msg *message.Message) (key string, ok bool) {
	if p.Key == nil {
		return "", false
	}
	defer func() {
		if recover() != nil {
			key, ok = "", false
		}
	}()
	k, err := p.Key(msg)
	if err != nil || k == "" {
		return "", false
	}
	return k, true
}
