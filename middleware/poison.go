package middleware

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
	"github.com/claimtx/claimtx/store"
)

// PoisonReasonKey is the metadata key of a poisoned copy that holds the
// error text that poisoned the message.
const PoisonReasonKey = poison.Reason

// Poison routes messages that cannot be processed to a poison/dead-letter
// topic with the reason, then lets the router ack the original. Nothing is
// acked without either an effect, a recorded duplicate, a copy in the
// poison topic or, when the broker refuses the copy, a row in DeadLetters:
// if neither can be written, the original is nacked.
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
//	claimtx_poison_reason     the error text (PoisonReasonKey), bounded:
//	                          at most 4096 bytes of valid UTF-8; a longer
//	                          text is cut and ends in
//	                          "… [truncated: N bytes, sha256:HEX]", the
//	                          length and hash of the whole text
//	claimtx_poison_permanent  "true" when the error was permanent (bad key,
//	                          undecodable payload), "false" when retries
//	                          were exhausted
//	claimtx_poison_consumer   Consumer, when set
//	claimtx_poison_key        the claim key from Key, when set and the key
//	                          could be derived
//	claimtx_poisoned_at       when the copy was made: RFC 3339, UTC, with
//	                          nine fraction digits
//
// besides Watermill's own reason_poisoned (the same bounded reason) /
// topic_poisoned / handler_poisoned / subscriber_poisoned keys, so
// Watermill tooling reads them. `claimtx dlq` reads them to list, classify
// and replay the destination, and a replay removes exactly these keys
// again. The reason is bounded because an error's text is not (Go's JSON
// error quotes a number whole): copied into two headers, a long one made a
// copy no broker takes (JetStream's 64 KiB of headers, RabbitMQ's frame
// size, Kafka's 1 MiB record), and the message was redelivered forever.
//
// A copy the broker refuses for good, which a built-in adapter reports as
// a framework.Permanent error (too large for it, not allowed, no such
// destination), is published again once as a smaller copy, whose reason
// is cut to 256 bytes: that is enough when the bookkeeping tipped a
// message near the broker's limit over it. When the broker refuses that
// too, the message is recorded in DeadLetters (the table
// <schema>.<claims table>_dead_letter, with the payload, the headers of the
// refused copy, the reason and the broker's error) and the original is
// acked once the row is committed. Either way OnRefused is told. Any other
// publish failure (the broker is unreachable, the publisher is
// reconnecting) nacks the original as before: it says nothing about the
// message, and the redelivery is poisoned again.
type Poison struct {
	// Publisher publishes the poisoned copies. Required.
	Publisher message.Publisher
	// Topic is the poison topic (for RabbitMQ, a durable queue of that
	// name). Required.
	Topic string
	// OnPoison, when set, is called after a copy was published or, when
	// the broker refused it, recorded in DeadLetters; err is the error
	// that poisoned msg, whole.
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
	// DeadLetters, when set, keeps in its dead-letter table
	// (<schema>.<claims table>_dead_letter, migration 6) the messages
	// whose poisoned copy the broker refused for good, smaller copy
	// included, so that their originals are acked instead of redelivered
	// forever. framework/consumer sets it to its store. Defaults to nil:
	// such a message is nacked.
	DeadLetters *store.Store
	// OnRefused, when set, is called when the broker refused a poisoned
	// copy for good, once the message went elsewhere or nowhere (see
	// PoisonRefusal). framework/consumer logs it and counts it in
	// claimtx_poison_refused_total. Defaults to nil.
	OnRefused func(msg *message.Message, r PoisonRefusal)
}

// PoisonRefusal tells Poison.OnRefused what became of a message whose
// poisoned copy the broker refused for good.
type PoisonRefusal struct {
	// Err is the broker's refusal: of the copy, and of the smaller copy
	// when one was tried; of the dead-letter row too when Fallback is "".
	Err error
	// Fallback is where the message went instead, the label value of
	// claimtx_poison_refused_total: "smaller_copy" (a copy with a reason
	// cut to 256 bytes was published to the poison topic), or
	// "dead_letter_table" (recorded in DeadLetters), or "" when neither
	// worked and the original is nacked (it comes back).
	Fallback string
}

// The values of PoisonRefusal.Fallback.
const (
	fallbackSmallerCopy     = "smaller_copy"
	fallbackDeadLetterTable = "dead_letter_table"
)

// shouldPoison is the fixed policy of Poison: permanent errors and every
// error that is not a transient database failure.
func shouldPoison(err error) bool {
	return framework.IsPermanent(err) || !store.IsTransient(err)
}

// NewPoison validates p and returns its middleware. A configuration error
// is returned here, so a poison route that cannot publish (every failing
// message nacked forever) cannot be installed.
func NewPoison(p Poison) (message.HandlerMiddleware, error) {
	switch {
	case p.Publisher == nil:
		return nil, &framework.ConfigError{Field: "Publisher", Reason: "must not be nil"}
	case p.Topic == "":
		return nil, &framework.ConfigError{Field: "Topic", Reason: "must not be empty"}
	}
	return p.middleware, nil
}

func (p Poison) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil || msg.Context().Err() != nil || !shouldPoison(err) {
			return out, err
		}
		if perr := p.deadLetter(msg, err); perr != nil {
			return nil, errors.Join(err, perr)
		}
		if p.OnPoison != nil {
			p.OnPoison(msg, err)
		}
		return nil, nil
	}
}

// deadLetter puts msg, poisoned because of err, in the poison topic or,
// when the broker refuses it there for good, in DeadLetters, as the type
// documentation describes. A non-nil error means it is nowhere: the
// original must be nacked.
func (p Poison) deadLetter(msg *message.Message, err error) error {
	cp := p.copyWithReason(msg, err, poison.MaxReasonBytes)
	perr := p.Publisher.Publish(p.Topic, cp)
	if perr == nil {
		return nil
	}
	perr = fmt.Errorf("claimtx: publish to poison topic %q: %w", p.Topic, perr)
	if interrupted(msg, perr) || !framework.IsPermanent(perr) {
		// A shutdown, or a failure that says nothing about this copy:
		// the redelivery is poisoned again.
		return perr
	}
	// Refused for good. The bookkeeping may be what tipped the copy over
	// the broker's limit: a copy with a shorter reason may pass.
	if small := p.copyWithReason(msg, err, poison.ShortReasonBytes); small.Metadata.Get(poison.Reason) != cp.Metadata.Get(poison.Reason) {
		serr := p.Publisher.Publish(p.Topic, small)
		if serr == nil {
			p.refused(msg, PoisonRefusal{Err: perr, Fallback: fallbackSmallerCopy})
			return nil
		}
		perr = errors.Join(perr, fmt.Errorf("claimtx: publish a smaller copy to poison topic %q: %w", p.Topic, serr))
		if interrupted(msg, serr) {
			return perr
		}
		// Whatever failed the smaller copy (the broker may also have
		// dropped the connection over the first one), the first copy
		// was refused for good: it cannot go to the poison topic.
	}
	if p.DeadLetters != nil {
		rerr := p.record(msg, cp, err, perr)
		if rerr == nil {
			p.refused(msg, PoisonRefusal{Err: perr, Fallback: fallbackDeadLetterTable})
			return nil
		}
		perr = errors.Join(perr, rerr)
	}
	p.refused(msg, PoisonRefusal{Err: perr})
	return perr
}

// interrupted reports whether a publish failed because the message's work
// was interrupted (its context ended: a shutdown, the drain timeout),
// which must never dead-letter it.
func interrupted(msg *message.Message, err error) bool {
	return msg.Context().Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

func (p Poison) refused(msg *message.Message, r PoisonRefusal) {
	if p.OnRefused != nil {
		p.OnRefused(msg, r)
	}
}

// record writes cp, the copy of msg the broker refused with perr, to
// DeadLetters, and returns once the row is committed. It runs detached
// from the message's context (bounded by poison.DeadLetterRecordTimeout): begun,
// a shutdown must not cut it half-way, and a row that did not commit
// leaves the original nacked.
func (p Poison) record(msg, cp *message.Message, err, perr error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), poison.DeadLetterRecordTimeout)
	defer cancel()
	key, _ := p.key(msg)
	return pg.ClaimsOf(p.DeadLetters).RecordDeadLetter(ctx, pg.DeadLetter{
		Consumer: p.Consumer, Key: key,
		Topic: cp.Metadata.Get(poison.WatermillTopic), PoisonTopic: p.Topic,
		UUID: msg.UUID, Reason: cp.Metadata.Get(poison.Reason), Permanent: framework.IsPermanent(err),
		PublishError: perr.Error(), Payload: cp.Payload, Metadata: cp.Metadata,
	})
}

// copyWithReason is the poisoned copy of msg, stamped as the type
// documentation describes, with the reason bounded to limit bytes.
func (p Poison) copyWithReason(msg *message.Message, err error, limit int) *message.Message {
	cp := msg.Copy()
	// A copy of a copy (poisoned, replayed by hand without cleaning,
	// poisoned again) must not keep the earlier stamps.
	for k := range cp.Metadata {
		if poison.IsPoisonKey(k) {
			delete(cp.Metadata, k)
		}
	}
	reason, _ := poison.BoundReason(err.Error(), limit)
	cp.Metadata.Set(poison.Reason, reason)
	cp.Metadata.Set(poison.Permanent, fmt.Sprint(framework.IsPermanent(err)))
	cp.Metadata.Set(poison.PoisonedAt, poison.FormatTime(time.Now()))
	if p.Consumer != "" {
		cp.Metadata.Set(poison.Consumer, p.Consumer)
	}
	if key, ok := p.key(msg); ok {
		cp.Metadata.Set(poison.Key, key)
	}
	cp.Metadata.Set(poison.WatermillReason, reason)
	cp.Metadata.Set(poison.WatermillTopic, cmp.Or(message.SubscribeTopicFromCtx(msg.Context()), p.SourceTopic))
	cp.Metadata.Set(poison.WatermillHandler, message.HandlerNameFromCtx(msg.Context()))
	cp.Metadata.Set(poison.WatermillSubscriber, message.SubscriberNameFromCtx(msg.Context()))
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
