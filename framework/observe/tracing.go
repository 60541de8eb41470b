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

// Span attribute keys, listed in docs/observability.md.
const (
	attrConsumer = attribute.Key("claimtx.consumer")
	attrOutcome  = attribute.Key("claimtx.outcome")
	attrAttempts = attribute.Key("claimtx.attempts")
	attrKeyHash  = attribute.Key("claimtx.key_hash")
)

// Tracing puts an OpenTelemetry span, continuing the trace context in the
// metadata, around each message's claim transaction. Place Middleware
// directly before the claim middleware and chain OnOutcome into the
// claim's OnOutcome (docs/observability.md).
type Tracing struct {
	// Tracer starts the spans. Defaults to otel.Tracer("claimtx").
	Tracer trace.Tracer
	// Propagator defaults to otel.GetTextMapPropagator() when that is set,
	// else W3C TraceContext.
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

// Middleware runs h within the span.
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

// OnOutcome annotates the message's span with the Result.
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

// keyHash is the hex of the first 8 bytes of key's SHA-256.
func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

// InjectTraceContext decorates a publisher so that every message carries
// the trace context of msg.Context(), for consumers to continue.
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
