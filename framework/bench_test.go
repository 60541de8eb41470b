package framework_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/claimtx/claimtx/framework"
)

// The middleware's own per-message CPU cost outside the database is key
// derivation and validation; these measure it.
func BenchmarkKeyTemplate(b *testing.B) {
	kf, err := framework.ParseKeySpec("template:order-completed:{payload.order_id}")
	if err != nil {
		b.Fatal(err)
	}
	msg := msgWith(`{"order_id": 9912, "customer_id": 7, "total_cents": 5000, "lines": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}]}`, nil)
	p := framework.KeyPolicy{}
	b.ReportAllocs()
	for b.Loop() {
		k, err := kf(msg)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Normalize(k); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkKeyMetadata(b *testing.B) {
	kf, err := framework.ParseKeySpec("metadata:event_id")
	if err != nil {
		b.Fatal(err)
	}
	msg := msgWith(`{}`, map[string]string{"event_id": "evt-123456"})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := kf(msg); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKeyPerByte derives a key from payloads of 1 kB to 1 MB of
// several shapes and reports ns/byte, which must stay flat as the payload
// grows: key derivation is linear in the payload, so that no message, even
// a hostile one, holds a consumer longer than its size warrants. The
// "long-number" and "too-deep" payloads are refused (a number longer than
// the key limit, nesting over 64 levels); the others are keyed.
func BenchmarkKeyPerByte(b *testing.B) {
	kf, err := framework.ParseKeySpec("template:o:{payload.order_id}")
	if err != nil {
		b.Fatal(err)
	}
	shapes := []struct {
		name    string
		refused bool
		build   func(size int) string
	}{
		{"numbers", false, func(size int) string {
			return fill(`{"order_id": 9.912e+03, "v": [`, `]}`, size, func(i int) string {
				return []string{"1.5", "-2.25e3", "12345678901234567890", "0.000125", "7"}[i%5]
			})
		}},
		{"long-number", true, func(size int) string {
			return `{"order_id": 1.` + strings.Repeat("7", max(size-17, 1)) + `}`
		}},
		{"strings", false, func(size int) string {
			return fill(`{"order_id": "A-17", "s": [`, `]}`, size, func(int) string {
				return `"a string with \"escapes\", \u00e9 and \ud83d\ude00 in it"`
			})
		}},
		{"nested", false, func(size int) string {
			// Subtrees 60 levels deep, just under the limit, side by side.
			tree := strings.Repeat(`{"a": [`, 30) + `1` + strings.Repeat(`]}`, 30)
			return fill(`{"order_id": 7, "t": [`, `]}`, size, func(int) string { return tree })
		}},
		{"too-deep", true, func(size int) string {
			n := (size - 16) / 2
			return `{"order_id": 7, "t": ` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}`
		}},
		{"fields", false, func(size int) string {
			return fill(`{"order_id": 7, `, `}`, size, func(i int) string {
				return fmt.Sprintf(`"field_%07d": "v%d"`, i, i)
			})
		}},
	}
	for _, sh := range shapes {
		for _, size := range []int{1 << 10, 10 << 10, 100 << 10, 1 << 20} {
			payload := sh.build(size)
			msg := msgWith(payload, nil)
			b.Run(fmt.Sprintf("%s/%s", sh.name, sizeName(size)), func(b *testing.B) {
				b.SetBytes(int64(len(payload)))
				b.ReportAllocs()
				for b.Loop() {
					_, err := kf(msg)
					if sh.refused != (err != nil) {
						b.Fatalf("refused=%v, err=%v", sh.refused, err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(payload)), "ns/byte")
			})
		}
	}
}

// fill builds head + elements joined by ", " + tail, of about size bytes.
func fill(head, tail string, size int, elem func(i int) string) string {
	var sb strings.Builder
	sb.WriteString(head)
	for i := 0; sb.Len()+len(tail) < size; i++ {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(elem(i))
	}
	sb.WriteString(tail)
	return sb.String()
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMB", n>>20)
	}
	return fmt.Sprintf("%dkB", n>>10)
}
