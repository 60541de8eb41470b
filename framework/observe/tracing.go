package observe

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/claimtx/claimtx/middleware"
)

// Span attribute keys, listed in docs/observability.md. The key hash
// correlates deliveries of one event without exporting the key.
const (
	attrConsumer = attribute.Key("claimtx.consumer")
	attrOutcome  = attribute.Key("claimtx.outcome")
	attrAttempts = attribute.Key("claimtx.attempts")
	attrKeyHash  = attribute.Key("claimtx.key_hash")
)

// Tracing puts an OpenTelemetry span around each message's claim
// transaction. Place Tracing.Middleware directly before the claim
// middleware and chain Tracing.OnOutcome into the claim's OnOutcome: the
// span then carries the consumer, outcome, attempts and key hash, and every
// query the handler makes with the message context is its child.
//
// When the message metadata carries a W3C trace context (a producer that
// published through InjectTraceContext, or any OTel-instrumented producer
// that writes "traceparent"), the span continues that trace.
type Tracing struct {
	// Tracer starts the spans. Defaults to otel.Tracer("claimtx").
	Tracer trace.Tracer
	// Propagator extracts the producer's context from metadata. Defaults to
	// otel.GetTextMapPropagator() when that is set, else W3C TraceContext.
	Propagator propagation.TextMapPropagator
}

func (t Tracing) propagator() propagation.TextMapPropagator {
	if t.Propagator != nil {
		return t.Propagator
	}
	if p := otel.GetTextMapPropagator(); len(p.Fields()) > 0 {
		return p
	}
	return propagation.TraceContext{}
}

// Middleware starts the span, runs h with it in the message context and
// ends it.
func (t Tracing) Middleware(h message.HandlerFunc) message.HandlerFunc {
	tracer, prop := cmp.Or(t.Tracer, otel.Tracer("claimtx")), t.propagator()
	return func(msg *message.Message) ([]*message.Message, error) {
		orig := msg.Context()
		parent := prop.Extract(orig, propagation.MapCarrier(msg.Metadata))
		ctx, span := tracer.Start(parent, "claimtx.claim "+message.HandlerNameFromCtx(orig),
			trace.WithSpanKind(trace.SpanKindConsumer))
		msg.SetContext(ctx)
		out, err := h(msg)
		msg.SetContext(orig)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		return out, err
	}
}

// OnOutcome annotates the message's span with the Result. Chain it into
// the claim's OnOutcome.
func (t Tracing) OnOutcome(r middleware.Result) {
	if r.Message == nil {
		return
	}
	span := trace.SpanFromContext(r.Message.Context())
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{attrConsumer.String(r.Consumer), attrOutcome.String(string(r.Outcome)), attrAttempts.Int(r.Attempts)}
	if r.Key != "" {
		attrs = append(attrs, attrKeyHash.String(keyHash(r.Key)))
	}
	span.SetAttributes(attrs...)
}

// keyHash is the hash of a key as it appears in spans: the hex of the
// first 8 bytes of its SHA-256.
func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

// InjectTraceContext decorates a publisher so that every message it
// publishes carries the trace context of its own context (msg.Context()),
// for consumers to continue.
func InjectTraceContext(pub message.Publisher, prop propagation.TextMapPropagator) message.Publisher {
	return injectingPublisher{Publisher: pub, prop: cmp.Or[propagation.TextMapPropagator](prop, propagation.TraceContext{})}
}

type injectingPublisher struct {
	message.Publisher
	prop propagation.TextMapPropagator
}

func (p injectingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		p.prop.Inject(m.Context(), propagation.MapCarrier(m.Metadata))
	}
	return p.Publisher.Publish(topic, msgs...)
}
