package pg

import (
	"strings"
	"unicode/utf8"
)

// Storable reports whether s can be a text or jsonb value as it is:
// Postgres refuses NUL bytes in both, and encoding/json would replace
// invalid UTF-8.
func Storable(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// Text makes s Storable, replacing NUL bytes and invalid UTF-8 with
// U+FFFD.
func Text(s string) string {
	if Storable(s) {
		return s
	}
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", "\uFFFD"), "\uFFFD")
}
