package middleware

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/store"
)

// Metadata set on poisoned copies, besides Watermill's own
// reason_poisoned / topic_poisoned / handler_poisoned keys (set too, so
// Watermill tooling reads them).
const (
	// PoisonReasonKey holds the error text that poisoned the message.
	PoisonReasonKey = "claimtx_poison_reason"
	// PoisonPermanentKey is "true" when the error was permanent (bad key,
	// undecodable payload), "false" when retries were exhausted.
	PoisonPermanentKey = "claimtx_poison_permanent"
)

// Poison routes messages that cannot be processed to a poison/dead-letter
// topic with the reason, then lets the router ack the original. Nothing is
// acked without either an effect, a recorded duplicate, or a copy in the
// poison topic: if publishing the copy fails, the original is nacked.
//
// Put it before Retry: Retry bounds the attempts of failing handlers, Poison
// catches what is left. By default transient database failures (the
// database is down) are not poisoned but nacked, so a database outage does
// not dead-letter every message in flight.
//
// Interrupted work is never poisoned, whatever ShouldPoison says: when the
// message's context has ended (the router or the subscription is shutting
// down, a rolling deploy's SIGTERM), the failure says nothing about the
// message, so the error is returned and the router nacks it; the broker
// redelivers it to a consumer that is not stopping.
type Poison struct {
	// Publisher publishes the poisoned copies. Required.
	Publisher message.Publisher
	// Topic is the poison topic (for RabbitMQ, a durable queue of that
	// name). Required.
	Topic string
	// ShouldPoison decides which errors are poisoned. Defaults to
	// DefaultShouldPoison.
	ShouldPoison func(error) bool
	// OnPoison, when set, is called after a copy was published.
	OnPoison func(msg *message.Message, err error)
}

// DefaultShouldPoison poisons permanent errors and every error that is not
// a transient database failure.
func DefaultShouldPoison(err error) bool {
	return framework.IsPermanent(err) || !store.IsTransient(err)
}

// Validate reports the first invalid field.
func (p Poison) Validate() error {
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
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p.middleware, nil
}

func (p Poison) middleware(h message.HandlerFunc) message.HandlerFunc {
	should := p.ShouldPoison
	if should == nil {
		should = DefaultShouldPoison
	}
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil || msg.Context().Err() != nil || !should(err) {
			return out, err
		}
		cp := msg.Copy()
		reason := err.Error()
		cp.Metadata.Set(PoisonReasonKey, reason)
		cp.Metadata.Set(PoisonPermanentKey, fmt.Sprint(framework.IsPermanent(err)))
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
