package opfmt

import (
	"encoding/base64"
	"strings"
	"unicode/utf8"
)

// OneLine makes s fit a table cell: whitespace runs become one space, and
// more than max runes are cut with an ellipsis.
func OneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) > max {
		r := []rune(s)
		s = string(r[:max-1]) + "…"
	}
	return s
}

// Payload renders a message payload for an operator: as text when it is
// UTF-8, else as "base64: …". With max > 0 at most max bytes are shown
// (cut reports it), and a cut never splits a character, so a long text
// payload still reads as text.
func Payload(b []byte, max int) (s string, cut bool) {
	if max > 0 && len(b) > max {
		head := b[:max]
		// A cut inside a character leaves up to UTFMax-1 bytes of it:
		// drop them when that is what keeps the rest from being text.
		for trim := 1; trim < utf8.UTFMax && trim < len(head); trim++ {
			if !utf8.Valid(head) && utf8.Valid(head[:len(head)-trim]) {
				head = head[:len(head)-trim]
				break
			}
		}
		b, cut = head, true
	}
	if utf8.Valid(b) {
		return string(b), cut
	}
	return "base64: " + base64.StdEncoding.EncodeToString(b), cut
}
