package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"strings"
	"testing"
)

var unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9_-]+`)

// UniqueName is a queue, topic, group or durable name unique to this test
// and run, so tests run in parallel and rerun on a dirty broker. The test's
// own name is cut to its last maxName characters, as brokers bound names
// (NATS durables the tightest).
func UniqueName(t testing.TB, maxName int) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := unsafeChars.ReplaceAllString(t.Name(), "_")
	if len(name) > maxName {
		name = name[len(name)-maxName:]
	}
	return "claimtx-test-" + strings.ToLower(name) + "-" + hex.EncodeToString(b)
}
