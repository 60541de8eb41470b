package framework_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
)

func msgWith(payload string, md map[string]string) *message.Message {
	m := message.NewMessage("uuid-changes-every-delivery", []byte(payload))
	for k, v := range md {
		m.Metadata.Set(k, v)
	}
	return m
}

func TestKeySpecs(t *testing.T) {
	t.Parallel()
	good := []struct {
		spec, payload string
		md            map[string]string
		want          string
	}{
		{"metadata:event_id", `{}`, map[string]string{"event_id": "e-1"}, "e-1"},
		{"json:order_id", `{"order_id": 9912}`, nil, "9912"},
		{"json:order_id", `{"order_id": 9912.0}`, nil, "9912"},
		{"json:order_id", `{"order_id": 9.912e+03}`, nil, "9912"},
		{"json:order_id", `{"order_id": 9912e0}`, nil, "9912"},
		{"json:order_id", `{"order_id": -0.50}`, nil, "-0.5"},
		{"json:order_id", `{"order_id": 12345678901234567890123}`, nil, "12345678901234567890123"},
		{"json:order_id", `{"order_id": "A-17"}`, nil, "A-17"},
		{"json:flag", `{"flag": true}`, nil, "true"},
		{"json:order.id", `{"order": {"id": 5}}`, nil, "5"},
		{"json:items.1.sku", `{"items": [{"sku": "a"}, {"sku": "b"}]}`, nil, "b"},
		{"template:order-completed:{payload.order_id}", `{"order_id": 9912}`, nil, "order-completed:9912"},
		{"template:{metadata.tenant}:{metadata.event_id}", `not json at all`, map[string]string{"tenant": "acme", "event_id": "e9"}, "acme:e9"},
		{"template:{{literal}}-{payload.a}-{payload.b}", `{"a": 1, "b": "x"}`, nil, "{literal}-1-x"},
		{"template:{metadata.a.b}", ``, map[string]string{"a.b": "dotted"}, "dotted"},
	}
	for _, tc := range good {
		t.Run(tc.spec+"/"+tc.payload, func(t *testing.T) {
			kf, err := framework.ParseKeySpec(tc.spec)
			require.NoError(t, err)
			got, err := kf(msgWith(tc.payload, tc.md))
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}

	badMessage := []struct {
		spec, payload string
		md            map[string]string
		reason        string
	}{
		{"metadata:event_id", `{}`, nil, "missing"},
		{"metadata:event_id", `{}`, map[string]string{"event_id": ""}, "empty"},
		{"json:order_id", `{"customer_id": 1}`, nil, "missing"},
		{"json:order_id", `{"order_id": null}`, nil, "null"},
		{"json:order_id", `{"order_id": {"a": 1}}`, nil, "object"},
		{"json:order_id", `{"order_id": [1]}`, nil, "array"},
		{"json:order_id", `{"order_id": ""}`, nil, "empty"},
		{"json:order_id", `{"order_id": 1e999999999}`, nil, "exponent"},
		{"json:order_id", `{"order_id": 1`, nil, "not valid JSON"},
		{"json:order_id", ``, nil, "empty"},
		{"json:order_id", `{"order_id": 1} {"x": 2}`, nil, "trailing"},
		// A closing bracket after the value: encoding/json's More() reports
		// no further value there, which once let this malformed payload be
		// keyed.
		{"json:order_id", `{"order_id": 1}]`, nil, "trailing"},
		{"template:k:{payload.order_id}", "{\"order_id\": 1}\n}\n", nil, "trailing"},
		{"json:a.b", `{"a": 5}`, nil, "cannot descend"},
		{"json:a.7", `{"a": [1]}`, nil, "no element"},
		{"template:k:{payload.order_id}", `[]`, nil, "no element"},
		{"template:k:{metadata.x}", `{}`, nil, "missing"},
	}
	for _, tc := range badMessage {
		t.Run("bad/"+tc.spec+"/"+tc.payload, func(t *testing.T) {
			kf, err := framework.ParseKeySpec(tc.spec)
			require.NoError(t, err)
			_, err = kf(msgWith(tc.payload, tc.md))
			require.ErrorAs(t, err, new(*framework.KeyError))
			require.True(t, framework.IsPermanent(err))
			require.Contains(t, err.Error(), tc.reason)
		})
	}

	badSpec := []string{
		"", "   ", "nosuch:x", "metadata:", "json:", "json:a..b", "template:", "template:no placeholder",
		"template:{payload.}", "template:{other.x}", "template:{payload.a", "template:a}", "template:{x}", "template:{payload.{a}}",
	}
	for _, spec := range badSpec {
		t.Run("spec/"+spec, func(t *testing.T) {
			_, err := framework.ParseKeySpec(spec)
			var ce *framework.ConfigError
			require.ErrorAs(t, err, &ce, "spec %q", spec)
			require.Equal(t, "key", ce.Field)
		})
	}
}

func TestFirstSpec(t *testing.T) {
	t.Parallel()
	first, err := framework.ParseKeySpec("first:metadata:event_id|json:order_id")
	require.NoError(t, err)
	k, err := first(msgWith(`{"order_id": 3}`, map[string]string{"event_id": "e"}))
	require.NoError(t, err)
	require.Equal(t, "e", k)
	k, err = first(msgWith(`{"order_id": 3}`, nil))
	require.NoError(t, err)
	// The fallback source is namespaced, so it cannot collide with an
	// event_id "3" (see TestFirstNonEmptyNamespacesSources).
	require.Equal(t, `\1:3`, k)
	_, err = first(msgWith(`{}`, nil))
	require.ErrorAs(t, err, new(*framework.KeyError))
	require.True(t, framework.IsPermanent(err))
	require.Contains(t, err.Error(), `metadata "event_id"`)
	require.Contains(t, err.Error(), `payload "order_id"`)

	// Alternatives are resolved by the registry that parses the spec, and
	// a non-key error from a user extractor is not masked as "no key".
	boom := errors.New("boom")
	r := framework.NewRegistry()
	require.NoError(t, r.RegisterKey("boom", func(string) (framework.KeyFunc, error) {
		return func(*message.Message) (string, error) { return "", boom }, nil
	}))
	f2, err := r.ParseKey("first: boom | json:order_id")
	require.NoError(t, err)
	_, err = f2(msgWith(`{"order_id": 3}`, nil))
	require.ErrorIs(t, err, boom)

	for _, bad := range []string{"first:", "first", "first:json:a|", "first:|json:a", "first:json:a||json:b", "first:first:json:a|json:b", "first:json:a|boom"} {
		_, err = framework.ParseKeySpec(bad)
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, bad)
		require.Equal(t, "key", ce.Field, bad)
	}
}

func TestKeyPolicy(t *testing.T) {
	t.Parallel()
	p := framework.KeyPolicy{}
	for _, bad := range []string{"", "a\x00b", string([]byte{0xff, 0xfe}), strings.Repeat("k", 513)} {
		_, err := p.Normalize(bad)
		require.ErrorAs(t, err, new(*framework.KeyError), "%q", bad)
		require.True(t, framework.IsPermanent(err))
	}
	k, err := p.Normalize(strings.Repeat("k", 512))
	require.NoError(t, err)
	require.Len(t, k, 512)

	h := framework.KeyPolicy{MaxBytes: 64, HashOverlong: true}
	long := strings.Repeat("x", 10_000)
	k1, err := h.Normalize(long)
	require.NoError(t, err)
	k2, err := h.Normalize(long)
	require.NoError(t, err)
	require.Equal(t, k1, k2, "hashing must be stable")
	require.True(t, strings.HasPrefix(k1, "sha256:"))
	require.Len(t, k1, 71)
	k3, err := h.Normalize(long + "y")
	require.NoError(t, err)
	require.NotEqual(t, k1, k3)
	short, err := h.Normalize("short")
	require.NoError(t, err)
	require.Equal(t, "short", short)
}

func TestRegistry(t *testing.T) {
	t.Parallel()
	r := framework.NewRegistry()
	require.NoError(t, r.RegisterKey("tenant-event", func(arg string) (framework.KeyFunc, error) {
		return framework.ParseKeySpec("template:{metadata.tenant}/" + arg + "/{metadata.event_id}")
	}))
	kf, err := r.ParseKey("tenant-event:orders")
	require.NoError(t, err)
	k, err := kf(msgWith("", map[string]string{"tenant": "t1", "event_id": "e1"}))
	require.NoError(t, err)
	require.Equal(t, "t1/orders/e1", k)

	var ce *framework.ConfigError
	require.ErrorAs(t, r.RegisterKey("tenant-event", func(string) (framework.KeyFunc, error) { return nil, nil }), &ce)
	require.ErrorAs(t, r.RegisterKey("metadata", func(string) (framework.KeyFunc, error) { return nil, nil }), &ce)
	require.ErrorAs(t, r.RegisterKey("first", func(string) (framework.KeyFunc, error) { return nil, nil }), &ce)
	require.ErrorAs(t, r.RegisterKey("Bad Name", func(string) (framework.KeyFunc, error) { return nil, nil }), &ce)
	require.ErrorAs(t, r.RegisterKey("nilfactory", nil), &ce)
	require.NoError(t, r.RegisterKey("nilfunc", func(string) (framework.KeyFunc, error) { return nil, nil }))
	_, err = r.ParseKey("nilfunc")
	require.ErrorAs(t, err, &ce)

	// Unknown names are listed with the registry's own, custom ones too.
	_, err = r.ParseKey("nosuch:x")
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "key", ce.Field)
	require.Contains(t, ce.Reason, "known: first, json, metadata, nilfunc, template, tenant-event)")

	// Registries are independent, and the package-level parser knows only
	// the built-ins: registering cannot change what a spec means elsewhere.
	_, err = framework.NewRegistry().ParseKey("tenant-event:orders")
	require.ErrorAs(t, err, &ce)
	_, err = framework.ParseKeySpec("tenant-event:orders")
	require.ErrorAs(t, err, &ce)
	require.Contains(t, ce.Reason, "known: first, json, metadata, template)")

	// The zero value is usable, with the built-ins.
	var zero framework.Registry
	_, err = zero.ParseKey("json:order_id")
	require.NoError(t, err)
	require.NoError(t, zero.RegisterKey("mine", func(string) (framework.KeyFunc, error) { return kf, nil }))
}

// Registering and parsing may run at once (a plugin registering while a
// config reloads).
func TestRegistryConcurrent(t *testing.T) {
	t.Parallel()
	r := framework.NewRegistry()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 50; i++ {
			_, _ = r.ParseKey("nosuch")
			_, _ = r.ParseTime("json:at")
		}
	}()
	for i := 0; i < 50; i++ {
		name := "x" + strings.Repeat("a", i%10) + string(rune('a'+i%26))
		_ = r.RegisterKey(name, func(string) (framework.KeyFunc, error) { return nil, nil })
		_ = r.RegisterTime(name, func(string) (framework.TimeFunc, error) { return nil, nil })
	}
	<-done
}

func TestErrors(t *testing.T) {
	t.Parallel()
	require.Nil(t, framework.Permanent(nil))
	base := errors.New("bad payload")
	p := framework.Permanent(base)
	require.True(t, framework.IsPermanent(p))
	require.ErrorIs(t, p, base)
	require.Same(t, p, framework.Permanent(p), "no double wrapping")
	require.False(t, framework.IsPermanent(base))
	require.Equal(t, "bad payload", p.Error())
	require.Contains(t, (&framework.PermanentError{}).Error(), "permanent")
	ce := &framework.ConfigError{Field: "X", Reason: "bad", Err: base}
	require.ErrorIs(t, ce, base)
	require.Contains(t, ce.Error(), `"X"`)
	require.Contains(t, (&framework.PanicError{Value: 3}).Error(), "3")
	require.Contains(t, (&framework.KeyError{Reason: "r"}).Error(), "r")
	// The typed errors are permanent by construction; AuthError is not a
	// message's fault and ConfigError is not about a message.
	require.True(t, framework.IsPermanent(fmt.Errorf("wrapped: %w", &framework.KeyError{})))
	require.True(t, framework.IsPermanent(&framework.EventTimeError{}))
	require.True(t, framework.IsPermanent(&framework.ExpiredError{}))
	require.False(t, framework.IsPermanent(&framework.AuthError{Err: base}))
	require.False(t, framework.IsPermanent(ce))
}
