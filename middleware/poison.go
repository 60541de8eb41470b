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

// Poison routes messages that cannot be processed to a poison topic with
// the reason, then lets the router ack the original: nothing is acked
// without an effect, a recorded duplicate, a copy in the poison topic or a
// row in DeadLetters; else the original is nacked.
//
// Put it before Retry. What is poisoned is fixed: permanent errors
// (framework.Permanent, a bad key) and every error that is not a transient
// database failure, which is nacked so that an outage does not dead-letter
// every message in flight. Interrupted work (the message's context ended:
// a shutdown, a deploy's SIGTERM) is nacked too: it says nothing about the
// message.
//
// A copy carries the original payload and metadata plus the
// claimtx_poison_* keys (PoisonReasonKey, permanent, consumer, key,
// poisoned_at) and Watermill's *_poisoned keys, which `claimtx dlq` reads
// and a replay removes. The reason is bounded to 4096 bytes: an error's
// text is not, and a copy no broker takes would be redelivered forever. A
// copy the broker refuses for good (a framework.Permanent publish error)
// is published once more with a 256-byte reason, else recorded in
// DeadLetters and the original acked; any other publish failure nacks.
// docs/operations.md, "Dead letters", has the details.
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
	// Consumer is stamped on each copy ("claimtx_poison_consumer"), so a
	// shared poison destination tells whose copy each is. Defaults to "":
	// not stamped.
	Consumer string
	// Key derives the claim key stamped on each copy ("claimtx_poison_key");
	// nothing is stamped when it fails, often why the message was poisoned.
	// Defaults to nil: not stamped.
	Key framework.KeyFunc
	// SourceTopic is stamped as Watermill's "topic_poisoned", where a replay
	// sends the copy, when the message's context names no topic (outside a
	// Watermill router). Defaults to "".
	SourceTopic string
	// DeadLetters, when set, records in its dead-letter table the messages
	// whose copies the broker refused for good, so that their originals are
	// acked instead of redelivered forever. Defaults to nil: nacked.
	DeadLetters *store.Store
	// OnRefused, when set, is called when the broker refused a copy for
	// good, once the message went elsewhere or nowhere. Defaults to nil.
	OnRefused func(msg *message.Message, r PoisonRefusal)
}

// PoisonRefusal tells Poison.OnRefused what became of a message whose
// poisoned copy the broker refused for good.
type PoisonRefusal struct {
	// Err is the broker's refusal of each copy tried, and the dead-letter
	// row's failure when Fallback is "".
	Err error
	// Fallback is where the message went instead: "smaller_copy",
	// "dead_letter_table" (DeadLetters), or "" when neither worked and the
	// original is nacked.
	Fallback string
}

// The values of PoisonRefusal.Fallback.
const (
	fallbackSmallerCopy     = "smaller_copy"
	fallbackDeadLetterTable = "dead_letter_table"
)

// NewPoison validates p and returns its middleware, so a poison route that
// cannot publish (every failing message nacked forever) cannot be installed.
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
		if err == nil || msg.Context().Err() != nil || !framework.IsPermanent(err) && store.IsTransient(err) || errors.As(err, new(*parkError)) {
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

// deadLetter puts msg, poisoned by err, in the poison topic or DeadLetters;
// an error means it is nowhere and the original must be nacked.
func (p Poison) deadLetter(msg *message.Message, err error) error {
	cp := p.copyWithReason(msg, err, poison.MaxReasonBytes)
	perr := p.Publisher.Publish(p.Topic, cp)
	if perr == nil {
		return nil
	}
	perr = fmt.Errorf("claimtx: publish to poison topic %q: %w", p.Topic, perr)
	if interrupted(msg, perr) || !framework.IsPermanent(perr) {
		return perr // the redelivery is poisoned again
	}
	// Refused for good: the bookkeeping may have tipped the copy over the
	// broker's limit.
	fallback := ""
	if small := p.copyWithReason(msg, err, poison.ShortReasonBytes); small.Metadata.Get(poison.Reason) != cp.Metadata.Get(poison.Reason) {
		if serr := p.Publisher.Publish(p.Topic, small); serr == nil {
			fallback = fallbackSmallerCopy
		} else {
			perr = errors.Join(perr, fmt.Errorf("claimtx: publish a smaller copy to poison topic %q: %w", p.Topic, serr))
			if interrupted(msg, serr) {
				return perr
			}
			// However else it failed (the broker may have dropped the
			// connection over the first), the first was refused for good.
		}
	}
	if fallback == "" && p.DeadLetters != nil {
		if rerr := p.record(msg, cp, err, perr); rerr == nil {
			fallback = fallbackDeadLetterTable
		} else {
			perr = errors.Join(perr, rerr)
		}
	}
	if p.OnRefused != nil {
		p.OnRefused(msg, PoisonRefusal{Err: perr, Fallback: fallback})
	}
	if fallback != "" {
		return nil
	}
	return perr
}

// interrupted reports whether a publish failed because the message's work
// was interrupted, which must never dead-letter it.
func interrupted(msg *message.Message, err error) bool {
	return msg.Context().Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// record writes cp, the copy of msg the broker refused with perr, to
// DeadLetters. It runs detached from the message's context (bounded by
// poison.DeadLetterRecordTimeout): a shutdown must not cut it half-way.
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

// copyWithReason is the poisoned copy of msg, its reason bounded to limit
// bytes.
func (p Poison) copyWithReason(msg *message.Message, err error, limit int) *message.Message {
	cp := msg.Copy()
	// A copy of a copy (replayed by hand without cleaning) drops old stamps.
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

// key derives msg's claim key with p.Key. A key function that panics (maybe
// why msg is poisoned) stamps no key: the copy must still be published.
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
