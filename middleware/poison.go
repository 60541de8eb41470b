package middleware

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/store"
)

// PoisonReasonKey is the metadata key of a poisoned copy that holds the
// error text that poisoned the message.
const PoisonReasonKey = "claimtx_poison_reason"

// poisonPermanentKey is documented on Poison under its value.
const poisonPermanentKey = "claimtx_poison_permanent"

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
// A poisoned copy carries the original payload and metadata, the error
// text under PoisonReasonKey ("claimtx_poison_reason"), and
// "claimtx_poison_permanent": "true" when the error was permanent (bad
// key, undecodable payload), "false" when retries were exhausted; besides
// Watermill's own reason_poisoned / topic_poisoned / handler_poisoned /
// subscriber_poisoned keys, so Watermill tooling reads them.
type Poison struct {
	// Publisher publishes the poisoned copies. Required.
	Publisher message.Publisher
	// Topic is the poison topic (for RabbitMQ, a durable queue of that
	// name). Required.
	Topic string
	// OnPoison, when set, is called after a copy was published.
	OnPoison func(msg *message.Message, err error)
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
		cp := msg.Copy()
		reason := err.Error()
		cp.Metadata.Set(PoisonReasonKey, reason)
		cp.Metadata.Set(poisonPermanentKey, fmt.Sprint(framework.IsPermanent(err)))
		cp.Metadata.Set(wmw.ReasonForPoisonedKey, reason)
		cp.Metadata.Set(wmw.PoisonedTopicKey, message.SubscribeTopicFromCtx(msg.Context()))
		cp.Metadata.Set(wmw.PoisonedHandlerKey, message.HandlerNameFromCtx(msg.Context()))
		cp.Metadata.Set(wmw.PoisonedSubscriberKey, message.SubscriberNameFromCtx(msg.Context()))
		if perr := p.Publisher.Publish(p.Topic, cp); perr != nil {
			return nil, errors.Join(err, fmt.Errorf("claimtx: publish to poison topic %q: %w", p.Topic, perr))
		}
		if p.OnPoison != nil {
			p.OnPoison(msg, err)
		}
		return nil, nil
	}
}
