package framework_test

import (
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
