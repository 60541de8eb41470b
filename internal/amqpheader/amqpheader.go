// Package amqpheader converts AMQP header values to the metadata strings
// claimtx's RabbitMQ adapter (brokers/amqp, "Headers and dead-letter
// replay") gives them. The dead-letter tooling (internal/dlq) reads poison
// queues with amqp091 directly and must see the same metadata a consumer
// sees, so that a key spec derives the same key.
package amqpheader

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// ToString converts one AMQP header value to its metadata string: strings
// as they are, valid UTF-8 byte arrays as strings, everything else as its
// JSON encoding (see brokers/amqp's package documentation for the mapping).
// It never fails.
func ToString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		if utf8.Valid(x) {
			return string(x)
		}
	}
	b, err := json.Marshal(jsonValue(v))
	if err != nil {
		// jsonValue only produces JSON-encodable values; this is a guard for
		// a type amqp091 may add one day, not an expected path.
		b, _ = json.Marshal(fmt.Sprint(v))
	}
	return string(b)
}

// jsonValue rewrites a decoded AMQP value into something encoding/json
// accepts without error and renders predictably.
func jsonValue(v any) any {
	switch x := v.(type) {
	case nil, bool, string, int8, uint8, int16, uint16, int32, uint32, int64, int:
		return x
	case float32:
		return jsonFloat(float64(x), 32)
	case float64:
		return jsonFloat(x, 64)
	case []byte:
		return base64.StdEncoding.EncodeToString(x)
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case amqp091.Decimal:
		return map[string]any{"scale": x.Scale, "value": x.Value}
	case amqp091.Table:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = jsonValue(e)
		}
		return m
	case map[string]any:
		return jsonValue(amqp091.Table(x))
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonValue(e)
		}
		return out
	default:
		return fmt.Sprint(x)
	}
}

func jsonFloat(f float64, bits int) any {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	}
	// json.Number keeps float32 values short ("0.1", not "0.10000000149").
	return json.Number(strconv.FormatFloat(f, 'g', -1, bits))
}
