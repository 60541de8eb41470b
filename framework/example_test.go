package framework_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
)

// A key comes from a spec, the same string KEY or a YAML key: field holds:
// here a metadata field, a payload field, and a template combining a fixed
// prefix with a payload field. The Watermill UUID, new on every delivery,
// plays no part.
func ExampleParseKeySpec() {
	msg := message.NewMessage("uuid-differs-per-delivery", []byte(`{"order":{"id":9912.0},"customer_id":"c-7"}`))
	msg.Metadata.Set("event_id", "evt-42")

	for _, spec := range []string{
		"metadata:event_id",
		"json:order.id",
		"template:order-completed:{payload.order.id}",
		"first:metadata:missing|json:customer_id",
	} {
		key, err := framework.ParseKeySpec(spec)
		if err != nil {
			panic(err)
		}
		k, err := key(msg)
		fmt.Printf("%-45s %s %v\n", spec, k, err)
	}

	// A message without the field cannot be keyed: a *KeyError, permanent.
	key, _ := framework.ParseKeySpec("metadata:event_id")
	_, err := key(message.NewMessage("u", []byte(`{}`)))
	fmt.Println(framework.IsPermanent(err))
	// Output:
	// metadata:event_id                             evt-42 <nil>
	// json:order.id                                 9912 <nil>
	// template:order-completed:{payload.order.id}   order-completed:9912 <nil>
	// first:metadata:missing|json:customer_id       \1:c-7 <nil>
	// true
}

// A key extractor of your own, registered by name so that configuration
// can select it: "tenant:orders" keys a message TENANT/orders/EVENT_ID from
// its tenant and event_id headers. Specs parsed with the same Registry still
// know the built-ins.
func ExampleRegistry_RegisterKey() {
	reg := framework.NewRegistry()
	err := reg.RegisterKey("tenant", func(arg string) (framework.KeyFunc, error) {
		if arg == "" {
			return nil, &framework.ConfigError{Field: "key", Reason: "tenant: needs a stream name"}
		}
		return func(m *message.Message) (string, error) {
			t := m.Metadata.Get("tenant")
			if t == "" || strings.Contains(t, "/") {
				return "", framework.Permanent(fmt.Errorf("tenant header %q is unusable", t))
			}
			return t + "/" + arg + "/" + m.Metadata.Get("event_id"), nil
		}, nil
	})
	if err != nil {
		panic(err)
	}

	msg := message.NewMessage("u", nil)
	msg.Metadata.Set("tenant", "acme")
	msg.Metadata.Set("event_id", "evt-42")

	key, err := reg.ParseKey("tenant:orders") // e.g. os.Getenv("KEY")
	if err != nil {
		panic(err)
	}
	fmt.Println(key(msg))

	// A spec may fall back on it too.
	key, _ = reg.ParseKey("first:json:id|tenant:orders")
	fmt.Println(key(msg))

	// The factory's own checks run when the spec is parsed.
	_, err = reg.ParseKey("tenant")
	fmt.Println(err)

	// The package-level parser knows only the built-ins.
	_, err = framework.ParseKeySpec("tenant:orders")
	fmt.Println(err)
	// Output:
	// acme/orders/evt-42 <nil>
	// \1:acme/orders/evt-42 <nil>
	// claimtx: config field "key": tenant: needs a stream name
	// claimtx: config field "key": unknown key extractor "tenant" in spec "tenant:orders" (known: first, json, metadata, template)
}

// An event time comes from a spec too: a field holding RFC 3339 or a Unix
// time, whose unit is told from its magnitude.
func ExampleParseTimeSpec() {
	eventTime, err := framework.ParseTimeSpec("json:occurred_at")
	if err != nil {
		panic(err)
	}
	for _, payload := range []string{
		`{"occurred_at":"2024-05-01T12:00:00+02:00"}`,
		`{"occurred_at":1714557600}`,
		`{"occurred_at":1714557600250}`,
	} {
		t, err := eventTime(message.NewMessage("u", []byte(payload)))
		fmt.Println(t.UTC().Format(time.RFC3339Nano), err)
	}
	// Output:
	// 2024-05-01T10:00:00Z <nil>
	// 2024-05-01T10:00:00Z <nil>
	// 2024-05-01T10:00:00.25Z <nil>
}

// A handler reads the key its message was claimed under, the key `claimtx
// explain --key` and the console look the message up by: here to log it
// with the effect. The redelivery is a duplicate: the handler does not run.
func ExampleClaimKey() {
	ctx := context.Background()
	st := testenv.ExampleStore(ctx) // a migrated store.Store on the test database
	defer testenv.DropExampleStore(st)

	key, err := framework.ParseKeySpec("template:order-completed:{payload.order_id}")
	if err != nil {
		panic(err)
	}
	claim, err := middleware.NewClaim(middleware.Claim{Store: st, Consumer: "loyalty", Key: key})
	if err != nil {
		panic(err)
	}
	credit := middleware.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		k, _ := framework.ClaimKey(ctx)
		fmt.Println("crediting", k)
		return nil
	})
	h := claim(func(msg *message.Message) ([]*message.Message, error) { return nil, credit(msg) })
	for _, uuid := range []string{"delivery-1", "delivery-2"} {
		if _, err := h(message.NewMessage(uuid, []byte(`{"order_id":9912}`))); err != nil {
			panic(err)
		}
	}
	// Output:
	// crediting order-completed:9912
}
