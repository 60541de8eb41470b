package observe_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/observe"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
	"github.com/claimtx/claimtx/store"
)

func newStore(t *testing.T, maxConns int32) *store.Store {
	t.Helper()
	st := testenv.Migrated(t, maxConns)
	_, err := st.Pool().Exec(context.Background(), "CREATE TABLE effects (k text NOT NULL)")
	require.NoError(t, err)
	return st
}

func effect(msg *message.Message) ([]*message.Message, error) {
	tx, ok := framework.TxFromContext(msg.Context())
	if !ok {
		return nil, framework.ErrNoClaimTx
	}
	// Hold the claim a little so the twins really overlap.
	_, err := tx.Exec(msg.Context(), "SELECT pg_sleep(0.03); INSERT INTO effects VALUES ('x')")
	return nil, err
}

func delivery(key string) *message.Message {
	m := testenv.Message(`{}`, "event_id", key)
	m.SetContext(context.Background())
	return m
}

func TestMetricsUnderConcurrentTwins(t *testing.T) {
	t.Parallel()
	st := newStore(t, 8)
	reg := prometheus.NewPedanticRegistry()
	m, err := observe.NewMetrics(reg)
	require.NoError(t, err)
	_, err = observe.NewMetrics(reg)
	require.Error(t, err, "registering twice must fail, not panic")

	key, err := framework.ParseKeySpec("metadata:event_id")
	require.NoError(t, err)
	c := middleware.Claim{Store: st, Consumer: "loyalty", Key: key, OnOutcome: m.OnOutcome, OnRetry: m.OnRetry}
	h := testenv.Install(t, middleware.NewClaim, c)(effect)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := h(delivery("k1"))
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	m.OnRetry(middleware.TxRetry{Consumer: "loyalty", Cause: "serialization"})

	val := func(outcome string) float64 {
		return testenv.RequireMetric(t, reg, "claimtx_messages_total", "consumer", "loyalty", "outcome", outcome)
	}
	require.Equal(t, 1.0, val("applied"))
	require.Equal(t, 7.0, val("duplicate"))
	require.Equal(t, 8.0, testenv.MetricSum(t, reg, "claimtx_claim_wait_seconds"))
	require.Equal(t, 8.0, testenv.MetricSum(t, reg, "claimtx_transaction_seconds"))
	require.Equal(t, 1.0, testenv.RequireMetric(t, reg, "claimtx_retries_total", "consumer", "loyalty", "cause", "serialization"))

	m.OnOutcome(middleware.Result{Consumer: "loyalty", Outcome: framework.Duplicate, FingerprintMismatch: true, Message: delivery("k")})
	require.Equal(t, 1.0, testenv.RequireMetric(t, reg, "claimtx_fingerprint_mismatch_total", "consumer", "loyalty"))
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)
}

// TestTraceContinuesAcrossTheBroker: a producer span's context travels in
// message metadata through the broker and the consumer's claim span joins
// that trace, annotated with the outcome and a hash (not the text) of the key.
func TestTraceContinuesAcrossTheBroker(t *testing.T) {
	t.Parallel()
	st := newStore(t, 4)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tracing := observe.Tracing{Tracer: tp.Tracer("test")}

	key, err := framework.ParseKeySpec("metadata:event_id")
	require.NoError(t, err)
	claim := middleware.Claim{Store: st, Consumer: "loyalty", Key: key, OnOutcome: tracing.OnOutcome}

	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	defer ps.Close()
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	require.NoError(t, err)
	done := make(chan struct{})
	var once sync.Once
	h := router.AddConsumerHandler("loyalty-handler", "orders", ps, func(msg *message.Message) error {
		_, err := effect(msg)
		once.Do(func() { close(done) })
		return err
	})
	h.AddMiddleware(tracing.Middleware, testenv.Install(t, middleware.NewClaim, claim))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	pctx, producerSpan := tp.Tracer("producer").Start(context.Background(), "publish order")
	msg := delivery("order-completed:1")
	msg.SetContext(pctx)
	require.NoError(t, observe.InjectTraceContext(ps, nil).Publish("orders", msg))
	producerSpan.End()
	require.NotEmpty(t, msg.Metadata.Get("traceparent"))

	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("message not consumed")
	}
	var claimSpan sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, s := range rec.Ended() {
			if strings.HasPrefix(s.Name(), "claimtx.claim") {
				claimSpan = s
				return true
			}
		}
		return false
	}, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, producerSpan.SpanContext().TraceID(), claimSpan.SpanContext().TraceID())
	require.Equal(t, producerSpan.SpanContext().SpanID(), claimSpan.Parent().SpanID())
	require.Equal(t, trace.SpanKindConsumer, claimSpan.SpanKind())
	attrs := map[string]string{}
	for _, a := range claimSpan.Attributes() {
		attrs[string(a.Key)] = a.Value.String()
	}
	require.Equal(t, "applied", attrs["claimtx.outcome"])
	require.Equal(t, "loyalty", attrs["claimtx.consumer"])
	require.Equal(t, observe.KeyHash("order-completed:1"), attrs["claimtx.key_hash"])
	for _, v := range attrs {
		require.NotContains(t, v, "order-completed:1", "the key itself must not be exported")
	}
}

func TestHealth(t *testing.T) {
	t.Parallel()
	st := newStore(t, 2)
	ok := observe.Health{Store: st, Broker: func(context.Context) error { return nil }}
	rr := httptest.NewRecorder()
	ok.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	require.Equal(t, http.StatusOK, rr.Code, rr.Body.String())
	var rep observe.Report
	require.NoError(t, json.Unmarshal(rr.Body.Bytes(), &rep))
	require.True(t, rep.Ready)
	require.Equal(t, map[string]string{"database": "ok", "migrations": "ok", "broker": "ok"}, rep.Checks)

	// Broker down.
	down := observe.Health{Store: st, Broker: observe.SubscriberConnected(connected(false))}
	rr = httptest.NewRecorder()
	down.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	require.Equal(t, http.StatusServiceUnavailable, rr.Code)
	require.Contains(t, rr.Body.String(), "broker connection is down")

	// Migrations behind: a schema no migration ran in.
	behind := testenv.Store(t, 1)
	rep = observe.Health{Store: behind}.Check(context.Background())
	require.False(t, rep.Ready)
	require.Contains(t, rep.Checks["migrations"], "needs")
	require.Equal(t, "ok", rep.Checks["database"])

	require.Nil(t, observe.SubscriberConnected(subscriber{}))
	require.NoError(t, observe.SubscriberConnected(connected(true))(context.Background()))
	require.Error(t, observe.SubscriberConnected(connected(false))(context.Background()))
	require.False(t, observe.Health{}.Check(context.Background()).Ready)
}

// subscriber is a message.Subscriber that does not report its connection.
type subscriber struct{}

func (subscriber) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return nil, nil
}
func (subscriber) Close() error { return nil }

// connected is a subscriber that does.
type connected bool

func (connected) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return nil, nil
}
func (connected) Close() error        { return nil }
func (c connected) IsConnected() bool { return bool(c) }

// TestDashboardQueriesRegisteredMetrics parses the Grafana dashboard and
// checks that every claimtx metric it queries is one NewMetrics registers.
func TestDashboardQueriesRegisteredMetrics(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../docs/grafana-dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	require.NotEmpty(t, dash.Panels)
	known := map[string]bool{}
	for _, n := range observe.Names() {
		known[n] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			known[n+suffix] = true
		}
	}
	metricRe := regexp.MustCompile(`claimtx_[a-z_]+`)
	queried := 0
	for _, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			names := metricRe.FindAllString(tg.Expr, -1)
			require.NotEmpty(t, names, "panel %q queries no claimtx metric: %s", p.Title, tg.Expr)
			for _, n := range names {
				require.True(t, known[n], "panel %q queries %s, which claimtx does not register", p.Title, n)
				queried++
			}
		}
	}
	require.Positive(t, queried)
}
