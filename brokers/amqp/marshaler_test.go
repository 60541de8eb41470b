package amqp_test

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/claimtx/claimtx/internal/amqpheader"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers/amqp"
)

// ackNoop satisfies amqp091.Acknowledger for deliveries built in tests.
type ackNoop struct{}

func (ackNoop) Ack(uint64, bool) error        { return nil }
func (ackNoop) Nack(uint64, bool, bool) error { return nil }
func (ackNoop) Reject(uint64, bool) error     { return nil }

func TestMarshalerRoundTrip(t *testing.T) {
	t.Parallel()
	msg := message.NewMessage("uuid-1", []byte("payload"))
	msg.Metadata.Set("event_id", "evt-1")
	msg.Metadata.Set(amqpheader.RoutingKey, "old-delivery")
	msg.Metadata.Set(wamqp.MetadataRedeliveredKey, "true")
	msg.Metadata.Set("x-delivery-count", "2")
	msg.Metadata.Set("x-acquired-count", "3")

	pub, err := amqp.Marshaler{}.Marshal(msg)
	require.NoError(t, err)
	require.Equal(t, amqp091.Persistent, pub.DeliveryMode)
	require.Equal(t, "uuid-1", pub.MessageId)
	require.Equal(t, amqp091.Table{"event_id": "evt-1", amqpheader.UUIDHeader: "uuid-1"}, pub.Headers,
		"delivery metadata (amqp_*, redelivered, a quorum queue's x-delivery-count) is not published")

	got, err := amqp.Marshaler{}.Unmarshal(amqp091.Delivery{
		Acknowledger: ackNoop{}, Headers: pub.Headers, MessageId: pub.MessageId, Body: pub.Body, RoutingKey: "q",
	})
	require.NoError(t, err)
	require.Equal(t, "uuid-1", got.UUID)
	require.Equal(t, "payload", string(got.Payload))
	require.Equal(t, message.Metadata{
		"event_id":            "evt-1",
		amqpheader.MessageID:  "uuid-1",
		amqpheader.RoutingKey: "q",
		amqpheader.Exchange:   "",
	}, got.Metadata)
}

// TestMetadataNames pins the names users write as strings in key specs
// and the package documentation lists.
func TestMetadataNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, map[string]string{
		"uuid":           "_watermill_message_uuid",
		"message id":     "amqp_message_id",
		"correlation id": "amqp_correlation_id",
		"content type":   "amqp_content_type",
		"timestamp":      "amqp_timestamp",
		"exchange":       "amqp_exchange",
		"routing key":    "amqp_routing_key",
		"redelivered":    "_watermill_amqp_redelivered",
	}, map[string]string{
		"uuid":           amqpheader.UUIDHeader,
		"message id":     amqpheader.MessageID,
		"correlation id": amqpheader.CorrelationID,
		"content type":   amqpheader.ContentType,
		"timestamp":      amqpheader.Timestamp,
		"exchange":       amqpheader.Exchange,
		"routing key":    amqpheader.RoutingKey,
		"redelivered":    wamqp.MetadataRedeliveredKey,
	})
}

func TestMarshalerUUIDSources(t *testing.T) {
	t.Parallel()
	m := amqp.Marshaler{}
	got, err := m.Unmarshal(amqp091.Delivery{Acknowledger: ackNoop{}, MessageId: "mid"})
	require.NoError(t, err)
	require.Equal(t, "mid", got.UUID, "message-id property when there is no UUID header")

	a, err := m.Unmarshal(amqp091.Delivery{Acknowledger: ackNoop{}})
	require.NoError(t, err)
	b, err := m.Unmarshal(amqp091.Delivery{Acknowledger: ackNoop{}})
	require.NoError(t, err)
	require.NotEmpty(t, a.UUID)
	require.NotEqual(t, a.UUID, b.UUID, "generated per message")

	got, err = m.Unmarshal(amqp091.Delivery{Acknowledger: ackNoop{}, Headers: amqp091.Table{amqpheader.UUIDHeader: []byte("from-bytes")}})
	require.NoError(t, err)
	require.Equal(t, "from-bytes", got.UUID)
}

// TestMarshalerZeroDelivery: the zero Delivery that watermill-amqp reads
// from a closed consumer channel must not become a message.
func TestMarshalerZeroDelivery(t *testing.T) {
	t.Parallel()
	_, err := amqp.Marshaler{}.Unmarshal(amqp091.Delivery{})
	require.Error(t, err)
}

func TestHeaderValueToString(t *testing.T) {
	t.Parallel()
	when := time.Date(2020, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))
	for _, tc := range []struct {
		in   any
		want string
	}{
		{"plain", "plain"},
		{"", ""},
		{[]byte("utf8"), "utf8"},
		{[]byte{0xff}, `"/w=="`},
		{true, "true"},
		{int8(-1), "-1"},
		{uint8(255), "255"},
		{int16(7), "7"},
		{int32(-7), "-7"},
		{int64(math.MaxInt64), "9223372036854775807"},
		{float32(0.1), "0.1"},
		{1.5, "1.5"},
		{math.NaN(), `"NaN"`},
		{math.Inf(1), `"+Inf"`},
		{math.Inf(-1), `"-Inf"`},
		{nil, "null"},
		{when, `"2020-01-02T02:04:05.000000006Z"`},
		{amqp091.Decimal{Scale: 2, Value: 1234}, `{"scale":2,"value":1234}`},
		{[]any{int64(1), "a", amqp091.Table{"k": false}}, `[1,"a",{"k":false}]`},
		{amqp091.Table{"b": 1.0, "a": []any{}}, `{"a":[],"b":1}`},
	} {
		require.Equal(t, tc.want, amqp.HeaderValueToString(tc.in), "%#v", tc.in)
	}
}

// FuzzHeaderValueToString builds arbitrary nested AMQP header values from
// the fuzz input and checks the conversion never fails: strings are kept,
// and everything else is valid JSON. The seed corpus is in
// testdata/fuzz/FuzzHeaderValueToString.
func FuzzHeaderValueToString(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00hello"))
	f.Add([]byte{10, 2, 0, 1, 'a', 9, 0, 5, 0xff, 0xf8, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		g := &gen{data: data}
		v := g.value(0)
		s := amqp.HeaderValueToString(v)
		switch x := v.(type) {
		case string:
			require.Equal(t, x, s)
		case []byte:
			if utf8.Valid(x) {
				require.Equal(t, string(x), s)
			} else {
				require.True(t, json.Valid([]byte(s)), "%q", s)
			}
		default:
			require.True(t, json.Valid([]byte(s)), "not JSON for %#v: %q", v, s)
		}
		// A table with this value must also survive a full Unmarshal.
		msg, err := amqp.Marshaler{}.Unmarshal(amqp091.Delivery{Acknowledger: ackNoop{}, Headers: amqp091.Table{"h": v}})
		require.NoError(t, err)
		require.Equal(t, s, msg.Metadata.Get("h"))
	})
}

// gen turns fuzz bytes into the Go values amqp091 decodes headers into.
type gen struct {
	data []byte
}

func (g *gen) byte() byte {
	if len(g.data) == 0 {
		return 0
	}
	b := g.data[0]
	g.data = g.data[1:]
	return b
}

func (g *gen) bytes(n int) []byte {
	n = min(n, len(g.data))
	b := g.data[:n]
	g.data = g.data[n:]
	return b
}

func (g *gen) u64() uint64 {
	var b [8]byte
	copy(b[:], g.bytes(8))
	return binary.BigEndian.Uint64(b[:])
}

func (g *gen) value(depth int) any {
	kind := g.byte() % 16
	if depth > 4 && kind >= 12 {
		kind %= 12
	}
	switch kind {
	case 0:
		return string(g.bytes(int(g.byte() % 32)))
	case 1:
		return g.byte()%2 == 1
	case 2:
		return int8(g.byte())
	case 3:
		return g.byte()
	case 4:
		return int16(g.u64())
	case 5:
		return int32(g.u64())
	case 6:
		return int64(g.u64())
	case 7:
		return math.Float32frombits(uint32(g.u64()))
	case 8:
		return math.Float64frombits(g.u64())
	case 9:
		return append([]byte(nil), g.bytes(int(g.byte()%32))...)
	case 10:
		return time.Unix(int64(g.u64()%(1<<40)), 0)
	case 11:
		return amqp091.Decimal{Scale: g.byte(), Value: int32(g.u64())}
	case 12, 13:
		n := int(g.byte() % 5)
		t := make(amqp091.Table, n)
		for range n {
			t[string(g.bytes(int(g.byte()%8)))] = g.value(depth + 1)
		}
		return t
	case 14:
		n := int(g.byte() % 5)
		a := make([]any, n)
		for i := range a {
			a[i] = g.value(depth + 1)
		}
		return a
	default:
		return nil
	}
}
