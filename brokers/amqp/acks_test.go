package amqp

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeBroker plays RabbitMQ's side of acks for the acker's logic: it holds
// the deliveries it has not been told about and fails the test if an ack
// reaches a delivery the application has not acked.
type fakeBroker struct {
	mu       sync.Mutex
	t        *testing.T
	unacked  map[uint64]bool // at the broker: delivered, not acked or nacked
	appAcked map[uint64]bool // what the application acked
	frames   int
}

func (b *fakeBroker) Ack(tag uint64, multiple bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.frames++
	for t := range b.unacked {
		if t == tag || (multiple && t < tag) {
			if !b.appAcked[t] {
				b.t.Errorf("ack(%d, multiple=%v) acks delivery %d, which the application did not ack", tag, multiple, t)
			}
			delete(b.unacked, t)
		}
	}
	return nil
}

func (b *fakeBroker) deliver(a *acker, tag uint64) {
	b.mu.Lock()
	b.unacked[tag] = true
	b.mu.Unlock()
	a.delivered(tag)
}

func (b *fakeBroker) appAck(a *acker, tag uint64) {
	b.mu.Lock()
	b.appAcked[tag] = true
	b.mu.Unlock()
	a.ack(tag)
}

func (b *fakeBroker) nack(a *acker, tag uint64) {
	b.mu.Lock()
	delete(b.unacked, tag)
	b.mu.Unlock()
	a.settled(tag)
}

func newFakeBroker(t *testing.T) *fakeBroker {
	return &fakeBroker{t: t, unacked: map[uint64]bool{}, appAcked: map[uint64]bool{}}
}

func TestAckerCoalescesContiguousAcks(t *testing.T) {
	b := newFakeBroker(t)
	a := newAcker(b)
	for tag := uint64(1); tag <= 5; tag++ {
		b.deliver(a, tag)
	}
	for _, tag := range []uint64{3, 1, 2} {
		b.appAck(a, tag)
	}
	a.flush()
	require.Equal(t, 1, b.frames, "one multiple ack for 1..3")
	require.Equal(t, map[uint64]bool{4: true, 5: true}, b.unacked)

	// 5 acked while 4 is in progress: sent alone, not held.
	b.appAck(a, 5)
	a.flush()
	require.Equal(t, 2, b.frames)
	require.Equal(t, map[uint64]bool{4: true}, b.unacked)
	b.appAck(a, 4)
	a.close()
	require.Empty(t, b.unacked, "close sends what was acked")
	b.deliver(a, 6)
	b.appAck(a, 6)
	a.flush()
	require.Equal(t, map[uint64]bool{6: true}, b.unacked, "nothing is sent after close")
}

// A nacked delivery in the middle does not stop the acks around it, and
// no multiple ack ever reaches a delivery the application has not acked.
func TestAckerRandomized(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			b := newFakeBroker(t)
			a := newAcker(b)
			var open []uint64
			next := uint64(1)
			for step := 0; step < 300; step++ {
				switch r := rng.IntN(10); {
				case r < 4:
					b.deliver(a, next)
					open = append(open, next)
					next++
				case r < 8 && len(open) > 0:
					i := rng.IntN(len(open))
					b.appAck(a, open[i])
					open = append(open[:i], open[i+1:]...)
				case r == 8 && len(open) > 0:
					i := rng.IntN(len(open))
					b.nack(a, open[i])
					open = append(open[:i], open[i+1:]...)
				default:
					a.flush()
				}
			}
			a.close()
			b.mu.Lock()
			defer b.mu.Unlock()
			require.Len(t, b.unacked, len(open), "exactly the deliveries still in progress stay unacked")
			for _, tag := range open {
				require.True(t, b.unacked[tag])
			}
		})
	}
}
