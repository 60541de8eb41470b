package main

import (
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// stdout returns what f prints on standard output.
func stdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	orig := os.Stdout
	os.Stdout = w
	defer func() { os.Stdout = orig }()
	f()
	require.NoError(t, w.Close())
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	return string(out)
}

// The table says why poisoned can exceed bad (a kill between poisoning and
// the ack poisons a message again), and says nothing when it does not.
func TestPrintTableExplainsRepeatedPoisonCopies(t *testing.T) {
	out := stdout(t, func() { printTable([]report{{broker: "kafka", orders: 100, bad: 20, applied: 100, poisoned: 29}}) })
	require.Contains(t, out, "at-least-once poisoning")
	require.Contains(t, out, "claimtx dlq list` marks the repeated copies")

	out = stdout(t, func() { printTable([]report{{broker: "amqp", orders: 100, bad: 20, applied: 100, poisoned: 20}}) })
	require.NotContains(t, out, "at-least-once poisoning")
}
