package framework_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/claimtx/claimtx/framework"
)

// FuzzKeySpec parses arbitrary specs and applies them to arbitrary
// messages. Properties: no panic; every failure to key is a KeyError (or a
// ConfigError for the spec); a produced key is deterministic; after
// KeyPolicy, a key is non-empty UTF-8 without NUL and within the limit.
func FuzzKeySpec(f *testing.F) {
	seeds := []struct{ spec, payload, md string }{
		{"json:order_id", `{"order_id": 9912}`, ""},
		{"json:order_id", `{"order_id": 9.912e+03}`, ""},
		{"json:a.0.b", `{"a": [{"b": "x"}]}`, ""},
		{"metadata:event_id", ``, "e-1"},
		{"template:order-completed:{payload.order_id}", `{"order_id": "x"}`, ""},
		{"template:{metadata.event_id}:{payload.n}", `{"n": -1.5e-3}`, "e"},
		{"template:{{}}{payload.n}", `{"n": 1e400}`, ""},
		{"json:n", `{"n": 1E-400}`, ""},
		{"json:n", "{\"n\": \"a\x00b\"}", ""},
		{"json:n", `{"n": "a\ud800b"}`, ""},
		{"template:{payload.n}", `{"n": "\ud83d\ude00\\ud800"}`, ""},
		{"json:n", `{"n": 0.` + strings.Repeat("7", 600) + `}`, ""},
		{"json:n", `{"n": 1, "d": ` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`, ""},
		{"template:{metadata.event_id}:{payload.n}", `{"n": "x"}`, `a:b\`},
		{"template:{payload.a}{payload.b}", `{"a": 1, "b": 23}`, ""},
		{"first:metadata:event_id|json:order_id", `{"order_id": 3}`, ""},
		{"first:metadata:event_id|template:o:{payload.n}", `{"n": 1}`, `\1:3`},
	}
	for _, s := range seeds {
		f.Add(s.spec, s.payload, s.md)
	}
	policy := framework.KeyPolicy{}
	f.Fuzz(func(t *testing.T, spec, payload, md string) {
		kf, err := framework.ParseKeySpec(spec)
		if err != nil {
			var ce *framework.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("spec error is not a ConfigError: %v", err)
			}
			return
		}
		m := msgWith(payload, map[string]string{"event_id": md})
		k1, err1 := kf(m)
		k2, err2 := kf(msgWith(payload, map[string]string{"event_id": md}))
		if (err1 == nil) != (err2 == nil) || k1 != k2 {
			t.Fatalf("not deterministic: %q/%v vs %q/%v", k1, err1, k2, err2)
		}
		if err1 != nil {
			if !errors.As(err1, new(*framework.KeyError)) || !framework.IsPermanent(err1) {
				t.Fatalf("key error is not a permanent *KeyError: %v", err1)
			}
			return
		}
		// U+FFFD in a key must come from the input, never from a decoder
		// replacing what it could not read: that would give two different
		// events one key.
		const fffd = "\uFFFD" // its UTF-8 bytes; ContainsRune(RuneError) would also match invalid bytes
		if strings.Contains(k1, fffd) && !strings.Contains(payload, fffd) && !strings.Contains(md, fffd) &&
			!strings.Contains(strings.ToLower(payload), `\ufffd`) {
			t.Fatalf("key %q has a U+FFFD the input did not", k1)
		}
		k, err := policy.Normalize(k1)
		if err != nil {
			if !errors.As(err, new(*framework.KeyError)) {
				t.Fatalf("policy error: %v", err)
			}
			return
		}
		if k == "" || !utf8.ValidString(k) || strings.IndexByte(k, 0) >= 0 || len(k) > 512 { // KeyPolicy.MaxBytes defaults to 512
			t.Fatalf("policy let through %q", k)
		}
	})
}

// FuzzCanonicalNumber checks that every spelling of a number that JSON
// allows keys identically to its integer spelling when it is integral.
func FuzzCanonicalNumber(f *testing.F) {
	f.Add(int64(9912), uint8(0))
	f.Add(int64(-5), uint8(3))
	f.Add(int64(0), uint8(1))
	kf, err := framework.ParseKeySpec("json:n")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, n int64, zeros uint8) {
		plain := strings.TrimSpace(itoa(n))
		variants := []string{plain, plain + ".0", plain + "e0", plain + "." + strings.Repeat("0", int(zeros%20)+1)}
		for _, v := range variants {
			got, err := kf(msgWith(`{"n": `+v+`}`, nil))
			if err != nil {
				t.Fatalf("%s: %v", v, err)
			}
			if got != plain {
				t.Fatalf("%s keyed as %q, want %q", v, got, plain)
			}
		}
	})
}

// FuzzTemplateInjective: for any separator a template accepts, two
// different pairs of values never give one key.
func FuzzTemplateInjective(f *testing.F) {
	f.Add(":", "a:b", "c", "a", "b:c")
	f.Add("/", `a\`, "b", "a", `\b`)
	f.Add("é-", "xé", "y", "x", "éy")
	f.Add("{{", "x{", "y", "x", "{y")
	f.Fuzz(func(t *testing.T, sep, a1, a2, b1, b2 string) {
		kf, err := framework.ParseKeySpec("template:p:{metadata.a}" + sep + "{metadata.b}:s")
		if err != nil {
			var ce *framework.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("template error is not a ConfigError: %v", err)
			}
			return
		}
		key := func(a, b string) (string, bool) {
			k, err := kf(msgWith("", map[string]string{"a": a, "b": b}))
			return k, err == nil
		}
		ka, okA := key(a1, a2)
		kb, okB := key(b1, b2)
		if okA && okB && (a1 != b1 || a2 != b2) && ka == kb {
			t.Fatalf("separator %q: (%q, %q) and (%q, %q) both give key %q", sep, a1, a2, b1, b2, ka)
		}
	})
}
