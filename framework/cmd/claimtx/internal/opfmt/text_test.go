package opfmt_test

import (
	"strings"
	"testing"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
)

func TestOneLine(t *testing.T) {
	for in, want := range map[string]string{
		"a\n\tb   c":      "a b c",
		"short":           "short",
		"ééééééééééé":     "ééééééééé…",
		"0123456789abcde": "012345678…",
	} {
		if got := opfmt.OneLine(in, 10); got != want {
			t.Errorf("OneLine(%q, 10) = %q, want %q", in, got, want)
		}
	}
}

func TestPayload(t *testing.T) {
	text := strings.Repeat("é", 10) // 20 bytes, two per character
	for _, c := range []struct {
		in      []byte
		max     int
		want    string
		wantCut bool
	}{
		{[]byte(`{"order_id": 1}`), 0, `{"order_id": 1}`, false},
		{[]byte(`{"order_id": 1}`), 100, `{"order_id": 1}`, false},
		// A cut in the middle of a character keeps the text as text.
		{[]byte(text), 7, "ééé", true},
		{[]byte(text), 8, "éééé", true},
		{[]byte{0xff, 0x00, 0x01}, 0, "base64: /wAB", false},
		{[]byte{0xff, 0x00, 0x01, 0x02}, 3, "base64: /wAB", true},
	} {
		got, cut := opfmt.Payload(c.in, c.max)
		if got != c.want || cut != c.wantCut {
			t.Errorf("Payload(%q, %d) = %q, %v; want %q, %v", c.in, c.max, got, cut, c.want, c.wantCut)
		}
	}
}
