package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/claimtx/claimtx/brokers"
	_ "github.com/claimtx/claimtx/brokers/amqp"  // registers the kind
	_ "github.com/claimtx/claimtx/brokers/kafka" // registers the kind
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/consumer"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
)

// errBadOrder is the handler's decode failure, marked permanent.
var errBadOrder = errors.New("bad order payload")

type badOrder struct {
	OrderID int64  `json:"order_id"`
	Points  int64  `json:"points"`
	Note    string `json:"note,omitempty"`
	Panic   bool   `json:"panic,omitempty"`
	Hang    bool   `json:"hang,omitempty"`
}

// attempts counts, per order id, how often the handler started and how
// long each run took.
type attempts struct {
	mu   sync.Mutex
	took map[int64][]time.Duration
}

func (a *attempts) add(id int64, d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.took[id] = append(a.took[id], d)
}

func (a *attempts) get(id int64) []time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Duration(nil), a.took[id]...)
}

// creditHandler is a loyalty-like effect with two kinds of misbehaviour on
// request: a panic, and a statement that hangs until its context ends.
func creditHandler(runs *attempts) middleware.TxHandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		var o badOrder
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return framework.Permanent(fmt.Errorf("%w: %w", errBadOrder, err))
		}
		start := time.Now()
		defer func() { runs.add(o.OrderID, time.Since(start)) }()
		if o.Panic {
			panic(fmt.Sprintf("handler bug on order %d", o.OrderID))
		}
		if o.Hang {
			// An external call or a lock that never comes back; the
			// claim's transaction is open meanwhile.
			if _, err := tx.Exec(ctx, "SELECT pg_sleep(3600)"); err != nil {
				return fmt.Errorf("order %d: %w", o.OrderID, err)
			}
		}
		_, err := tx.Exec(ctx, "INSERT INTO ledger (order_id, points) VALUES ($1, $2)", o.OrderID, o.Points)
		return err
	}
}

// badRow is one hostile (or merely unusual) message and what must become
// of it.
type badRow struct {
	name   string
	broker string // "amqp" or "kafka" when the row only makes sense there
	// eventID is the event_id header (the key): a string, nil for none, or
	// for RabbitMQ any AMQP field value.
	eventID      any
	amqpHeaders  amqp091.Table
	kafkaHeaders []kgo.RecordHeader
	payload      []byte
	// applied: valid, must be credited exactly once. Otherwise it must be
	// poisoned with reason (a substring) and an error accepted by typed.
	applied bool
	reason  string
	typed   func(t *testing.T, err error)
	// retried: the handler ran 1 + HandlerRetries times, each run at
	// least this long.
	retried *time.Duration
}

func isKeyError(t *testing.T, err error) {
	t.Helper()
	var ke *framework.KeyError
	require.ErrorAs(t, err, &ke)
	require.ErrorAs(t, err, new(*framework.KeyError))
	require.True(t, framework.IsPermanent(err), "a key error is permanent")
}

func orderJSON(o badOrder) []byte {
	b, _ := json.Marshal(o)
	return b
}

func badRows() []badRow {
	huge := strings.Repeat("é", 256<<10) // 512 KB of valid UTF-8
	rows := []badRow{
		{name: "missing key field", eventID: nil, payload: orderJSON(badOrder{OrderID: 1001, Points: 1}),
			reason: `metadata "event_id": field is missing`, typed: isKeyError},
		{name: "empty key", eventID: "", payload: orderJSON(badOrder{OrderID: 1002, Points: 1}),
			reason: "field is empty", typed: isKeyError},
		{name: "10 KB key", eventID: strings.Repeat("k", 10<<10), payload: orderJSON(badOrder{OrderID: 1003, Points: 1}),
			reason: "key is 10240 bytes, longer than the limit of 512", typed: isKeyError},
		{name: "invalid UTF-8 key", eventID: "evt-\xff\xfe", payload: orderJSON(badOrder{OrderID: 1004, Points: 1}),
			reason: "not valid UTF-8", typed: isKeyError},
		{name: "NUL byte in key", eventID: "evt-\x00-1005", payload: orderJSON(badOrder{OrderID: 1005, Points: 1}),
			reason: "NUL byte", typed: isKeyError},
		{name: "malformed JSON", eventID: "evt-1006", payload: []byte(`{"order_id": 1006, "points": `),
			reason: "unexpected end of JSON input", typed: func(t *testing.T, err error) {
				require.ErrorIs(t, err, errBadOrder)
				var se *json.SyntaxError
				require.ErrorAs(t, err, &se)
				require.True(t, framework.IsPermanent(err))
			}},
		{name: "wrong JSON types", eventID: "evt-1007", payload: []byte(`{"order_id": "1007", "points": true}`),
			reason: "cannot unmarshal string", typed: func(t *testing.T, err error) {
				require.ErrorIs(t, err, errBadOrder)
				var te *json.UnmarshalTypeError
				require.ErrorAs(t, err, &te)
				require.True(t, framework.IsPermanent(err))
			}},
		{name: "huge valid payload (512 KB)", eventID: "evt-1008", payload: orderJSON(badOrder{OrderID: 1008, Points: 8, Note: huge}),
			applied: true},
		{name: "huge invalid payload (600 KB)", eventID: "evt-1009", payload: []byte("{" + strings.Repeat("x", 600<<10)),
			reason: "invalid character 'x'", typed: func(t *testing.T, err error) {
				require.ErrorIs(t, err, errBadOrder)
				require.Less(t, len(err.Error()), 1000, "the reason does not repeat the payload")
			}},
		{name: "non-string AMQP headers", broker: "amqp", eventID: "evt-1010", payload: orderJSON(badOrder{OrderID: 1010, Points: 10}),
			amqpHeaders: amqp091.Table{
				"retries": int32(3), "big": int64(1 << 40), "flag": true, "ratio": 1.5, "f32": float32(2.5),
				"when": time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), "bin": []byte{0xff, 0x00, 0xfe},
				"dec": amqp091.Decimal{Scale: 2, Value: 12345}, "void": nil,
				"nested": amqp091.Table{"a": int64(1), "b": amqp091.Table{"c": "d"}},
				"list":   []any{"x", int64(2), amqp091.Table{"y": false}},
				"x-death": []any{amqp091.Table{"count": int64(2), "reason": "rejected", "queue": "orders",
					"time": time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), "exchange": "", "routing-keys": []any{"orders"}}},
			},
			applied: true},
		{name: "non-string AMQP key header (int64)", broker: "amqp", eventID: int64(424242), payload: orderJSON(badOrder{OrderID: 1011, Points: 11}),
			applied: true},
		{name: "unknown Kafka headers", broker: "kafka", eventID: "evt-1012", payload: orderJSON(badOrder{OrderID: 1012, Points: 12}),
			kafkaHeaders: []kgo.RecordHeader{
				{Key: "x-binary", Value: []byte{0xff, 0x00, 0xfe}}, {Key: "", Value: []byte("empty key")},
				{Key: "x-nil", Value: nil}, {Key: "x-nul\x00key", Value: []byte("v")}, {Key: "\xff\xfe", Value: []byte("bad key")},
				{Key: "_watermill_message_uuid", Value: []byte("not-a-uuid")}, {Key: "kafka_offset", Value: []byte("-1")},
			},
			applied: true},
		{name: "handler panics", eventID: "evt-1013", payload: orderJSON(badOrder{OrderID: 1013, Points: 13, Panic: true}), retried: new(time.Duration(0)),
			reason: "handler panicked: handler bug on order 1013", typed: func(t *testing.T, err error) {
				var pe *framework.PanicError
				require.ErrorAs(t, err, &pe)
				require.NotEmpty(t, pe.Stack)
			}},
		{name: "handler hangs past the timeout", eventID: "evt-1014", payload: orderJSON(badOrder{OrderID: 1014, Points: 14, Hang: true}), retried: new(500 * time.Millisecond),
			reason: "handler did not finish within 1s", typed: func(t *testing.T, err error) {
				var te *consumer.HandlerTimeoutError
				require.ErrorAs(t, err, &te)
				require.Equal(t, time.Second, te.Timeout)
				require.ErrorIs(t, err, context.DeadlineExceeded)
			}},
	}
	// Many unknown headers, as a chatty tracing stack sends them.
	many := make([]kgo.RecordHeader, 100)
	for i := range many {
		many[i] = kgo.RecordHeader{Key: fmt.Sprintf("x-h-%d", i), Value: []byte(strings.Repeat("v", i))}
	}
	rows = append(rows, badRow{name: "100 unknown Kafka headers", broker: "kafka", eventID: "evt-1015",
		payload: orderJSON(badOrder{OrderID: 1015, Points: 15}), kafkaHeaders: many, applied: true})
	return rows
}

// TestBadInput sends every row of the bad-input table through the composed
// consumer on real RabbitMQ and on the dev Kafka broker, a good order
// after each: every bad row is poisoned with its reason and a typed error,
// every valid one is credited exactly once, and the consumer keeps serving
// the good orders behind them. docs/reliability.md has the table.
func TestBadInput(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"amqp", "kafka"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			testBadInput(t, kind)
		})
	}
}

// poisonRecorder keeps, per row, the error each Poisoned outcome carried.
type poisonRecorder struct {
	mu   sync.Mutex
	errs map[string][]error
}

func (p *poisonRecorder) on(r middleware.Result) {
	if r.Outcome != framework.Poisoned {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	row := r.Message.Metadata.Get("row")
	p.errs[row] = append(p.errs[row], r.Err)
}

func (p *poisonRecorder) total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, errs := range p.errs {
		n += len(errs)
	}
	return n
}

func (p *poisonRecorder) get(row string) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]error(nil), p.errs[row]...)
}

func testBadInput(t *testing.T, kind string) {
	pool, schema := testenv.Setup(t, 8)
	ctx := t.Context()
	_, err := pool.Exec(ctx, "CREATE TABLE ledger (order_id bigint NOT NULL, points bigint NOT NULL)")
	require.NoError(t, err)
	topic := "badinput-" + kind + "-" + randHex()
	bp := newRawBroker(t, kind, topic)

	rec := &poisonRecorder{errs: map[string][]error{}}
	runs := &attempts{took: map[int64][]time.Duration{}}
	cfg := baseConfig("badinput", topic, pool, schema, bp.cfg)
	cfg.HandlerRetries, cfg.RetryInitialInterval, cfg.HandlerTimeout = 1, 10*time.Millisecond, time.Second
	cfg.Claim.MaxClaimWait, cfg.OnOutcome = 500*time.Millisecond, rec.on
	c, err := consumer.New(ctx, cfg, creditHandler(runs))
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := runUntilCancel(runCtx, c)
	t.Cleanup(func() {
		stopConsumer(t, cancel, done)
		require.NoError(t, c.Close())
	})

	var rows []badRow
	for _, r := range badRows() {
		if r.broker == "" || r.broker == kind {
			rows = append(rows, r)
		}
	}
	good := 0
	wantPoints := map[int64]int64{}
	for i, r := range rows {
		bp.publish(t, r, fmt.Sprintf("row-%d", i))
		if r.applied {
			var o badOrder
			require.NoError(t, json.Unmarshal(r.payload, &o))
			wantPoints[o.OrderID] = o.Points
		}
		// A good order behind every row: the consumer must keep serving.
		good++
		g := badOrder{OrderID: int64(good), Points: int64(good)}
		bp.publish(t, badRow{eventID: fmt.Sprintf("good-%d", good), payload: orderJSON(g)}, fmt.Sprintf("good-%d", good))
		wantPoints[g.OrderID] = g.Points
	}

	wantPoisoned := 0
	for _, r := range rows {
		if !r.applied {
			wantPoisoned++
		}
	}
	poisoned := bp.poisoned(t, wantPoisoned)
	require.Eventually(t, func() bool {
		var n int
		return pool.QueryRow(ctx, "SELECT count(*) FROM ledger").Scan(&n) == nil && n == len(wantPoints)
	}, 60*time.Second, 20*time.Millisecond, "every valid message applied")

	// Exactly once: one ledger row per valid order, with its points.
	got := map[int64]int64{}
	rowsDB, err := pool.Query(ctx, "SELECT order_id, sum(points), count(*) FROM ledger GROUP BY order_id")
	require.NoError(t, err)
	for rowsDB.Next() {
		var id, pts, n int64
		require.NoError(t, rowsDB.Scan(&id, &pts, &n))
		require.EqualValues(t, 1, n, "order %d applied %d times", id, n)
		got[id] = pts
	}
	require.NoError(t, rowsDB.Err())
	require.Equal(t, wantPoints, got)

	// Every bad row poisoned exactly once (no crash, so no repeat), with
	// its reason, its original payload and a typed error.
	for i, r := range rows {
		row := fmt.Sprintf("row-%d", i)
		t.Run(r.name, func(t *testing.T) {
			if r.applied {
				require.NotContains(t, poisoned, row, "a valid message must not be poisoned")
				return
			}
			p, ok := poisoned[row]
			require.True(t, ok, "not in the poison destination")
			require.Contains(t, p.reason, r.reason)
			require.Equal(t, string(r.payload), string(p.body), "the original payload is kept")
			errs := rec.get(row)
			require.Len(t, errs, 1, "poisoned once")
			r.typed(t, errs[0])
			if r.retried != nil {
				var o badOrder
				require.NoError(t, json.Unmarshal(r.payload, &o))
				took := runs.get(o.OrderID)
				require.Len(t, took, 2, "1 + HandlerRetries runs")
				for _, d := range took {
					// Each retry gets a fresh deadline (the claim takes a
					// little of it, more on a loaded machine): neither run
					// starts already expired, which would show as ~0.
					require.GreaterOrEqual(t, d, *r.retried)
				}
			}
		})
	}
	require.Len(t, poisoned, wantPoisoned, "nothing else was poisoned")
	require.Equal(t, wantPoisoned, rec.total(), "one Poisoned outcome per bad row")
}

// rawBroker publishes as a plain producer would (amqp091 / franz-go, no
// Watermill), so headers can be anything the wire allows, and reads the
// poison destination back.
type rawBroker struct {
	kind, topic string
	cfg         brokers.Config
	amqpConn    *amqp091.Connection
	kcl         *kgo.Client
	kafkaAddr   string
}

type poisonCopy struct {
	reason string
	body   []byte
}

// amqpQueue connects to RabbitMQ at the adapter's default URL and
// declares topic's queue with args; both it and the poison queue are
// deleted, and the connection closed, when the test ends.
func amqpQueue(t *testing.T, topic string, args amqp091.Table) *amqp091.Connection {
	t.Helper()
	conn, err := amqp091.Dial("amqp://guest:guest@127.0.0.1:5672/")
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(topic, true, false, false, false, args)
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(topic, false, false, false)
			_, _ = ch.QueueDelete(topic+poisonSuffix, false, false, false)
			_ = ch.Close()
		}
		_ = conn.Close()
	})
	return conn
}

func newRawBroker(t *testing.T, kind, topic string) *rawBroker {
	t.Helper()
	rb := &rawBroker{kind: kind, topic: topic}
	switch kind {
	case "amqp":
		rb.amqpConn = amqpQueue(t, topic, nil)
		rb.cfg = brokers.Config{Kind: brokers.KindAMQP, AMQP: brokers.AMQPConfig{Concurrency: 2, NackDelay: 50 * time.Millisecond}}
	case "kafka":
		br := startKafka(t)
		rb.kafkaAddr = br.Addrs()[0]
		rb.kcl = kafkaClient(t, br, kgo.ProducerLinger(0))
		createTopics(t, rb.kcl, 2, nil, topic)
		createTopics(t, rb.kcl, 1, nil, topic+poisonSuffix)
		rb.cfg = brokers.Config{Kind: brokers.KindKafka, Kafka: brokers.KafkaConfig{
			Brokers: br.Addrs(), ConsumerGroup: "badinput-" + randHex(),
			SessionTimeout: 3 * time.Second, RebalanceTimeout: 3 * time.Second, NackDelay: 50 * time.Millisecond,
		}}
	}
	return rb
}

func (rb *rawBroker) publish(t *testing.T, r badRow, row string) {
	t.Helper()
	switch rb.kind {
	case "amqp":
		headers := amqp091.Table{"row": row}
		for k, v := range r.amqpHeaders {
			headers[k] = v
		}
		if r.eventID != nil {
			headers["event_id"] = r.eventID
		}
		rb.publishAMQP(t, amqp091.Publishing{MessageId: "broker-" + randHex(), Headers: headers, Body: r.payload})
	case "kafka":
		headers := []kgo.RecordHeader{{Key: "row", Value: []byte(row)}}
		if r.eventID != nil {
			headers = append(headers, kgo.RecordHeader{Key: "event_id", Value: []byte(r.eventID.(string))})
		}
		headers = append(headers, r.kafkaHeaders...)
		require.NoError(t, rb.kcl.ProduceSync(t.Context(), &kgo.Record{Topic: rb.topic, Value: r.payload, Headers: headers}).FirstErr())
	}
}

// publishAMQP publishes p, persistent, to the topic's queue and waits for
// RabbitMQ's confirm.
func (rb *rawBroker) publishAMQP(t *testing.T, p amqp091.Publishing) {
	t.Helper()
	ch, err := rb.amqpConn.Channel()
	require.NoError(t, err)
	defer func() { _ = ch.Close() }()
	require.NoError(t, ch.Confirm(false))
	confirm := ch.NotifyPublish(make(chan amqp091.Confirmation, 1))
	p.DeliveryMode = amqp091.Persistent
	require.NoError(t, ch.PublishWithContext(t.Context(), "", rb.topic, false, false, p))
	require.True(t, (<-confirm).Ack)
}

// poisoned reads n messages from the poison destination, keyed by row.
func (rb *rawBroker) poisoned(t *testing.T, n int) map[string]poisonCopy {
	t.Helper()
	out := map[string]poisonCopy{}
	add := func(row, reason string, body []byte) {
		require.NotContains(t, out, row, "row %s poisoned twice", row)
		out[row] = poisonCopy{reason: reason, body: body}
	}
	switch rb.kind {
	case "amqp":
		ch, err := rb.amqpConn.Channel()
		require.NoError(t, err)
		defer func() { _ = ch.Close() }()
		// The consumer declares the poison queue on its first poisoned
		// message; until then Get fails (404) and closes the channel.
		require.Eventually(t, func() bool {
			d, ok, err := ch.Get(rb.topic+poisonSuffix, true)
			if err != nil {
				ch, err = rb.amqpConn.Channel()
				require.NoError(t, err)
				return false
			}
			if ok {
				add(fmt.Sprint(d.Headers["row"]), fmt.Sprint(d.Headers[middleware.PoisonReasonKey]), d.Body)
			}
			return len(out) >= n
		}, 60*time.Second, 10*time.Millisecond, "poisoned messages")
	case "kafka":
		cl, err := kgo.NewClient(kgo.SeedBrokers(rb.kafkaAddr), kgo.ConsumeTopics(rb.topic+poisonSuffix),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		require.NoError(t, err)
		defer cl.Close()
		require.Eventually(t, func() bool {
			fctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			defer cancel()
			cl.PollFetches(fctx).EachRecord(func(r *kgo.Record) {
				h := map[string]string{}
				for _, hd := range r.Headers {
					h[hd.Key] = string(hd.Value)
				}
				add(h["row"], h[middleware.PoisonReasonKey], r.Value)
			})
			return len(out) >= n
		}, 60*time.Second, 10*time.Millisecond, "poisoned messages")
	}
	return out
}

func TestHandlerTimeoutMustNotBeNegative(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.Setup(t, 1)
	_, err := consumer.New(t.Context(), consumer.Config{Name: "c", Topic: "t", Key: "metadata:event_id", Pool: pool,
		Broker: brokers.Config{Kind: brokers.KindGoChannel}, HandlerTimeout: -time.Second}, creditHandler(nil))
	requireConfigError(t, err, "HandlerTimeout")
}
