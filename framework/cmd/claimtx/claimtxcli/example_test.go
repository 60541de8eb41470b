package claimtxcli_test

import (
	"context"
	"fmt"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/claimtxcli"
)

// A program of your own serving the claimtx CLI with the key extractor
// its consumers register: tenant_idem:FIELD keys a reservation by its
// tenant header and a payload field. Its main is one line,
//
//	claimtxcli.Main(claimtxcli.Config{Extractors: reg})
//
// and `inventory-ctl keys check --key-spec tenant_idem:idempotency_key
// --file F` then runs as below (dlq, explain and the console alike).
func Example() {
	reg := framework.NewRegistry()
	err := reg.RegisterKey("tenant_idem", func(field string) (framework.KeyFunc, error) {
		id, err := framework.ParseKeySpec("json:" + field)
		if err != nil {
			return nil, err
		}
		return func(m *message.Message) (string, error) {
			k, err := id(m)
			return m.Metadata.Get("tenant") + "/" + k, err
		}, nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	code := claimtxcli.Run(context.Background(), claimtxcli.Config{Extractors: reg},
		[]string{"keys", "check", "--key-spec", "tenant_idem:idempotency_key", "--file", "testdata/reservations.jsonl"},
		os.Stdout, os.Stderr)
	fmt.Println("exit status", code)
	// Output:
	// key spec tenant_idem:idempotency_key over 3 messages of file testdata/reservations.jsonl
	//   keyed 3, distinct keys 2, duplicates 1 (same key, same payload: redeliveries, harmless)
	//   key length in bytes: min 8, p50 8, p90 10, p99 10, max 10 (limit 512)
	// OK: no key is shared by different payloads
	// exit status 0
}
