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
	sendHook func() // runs during the next Ack, as if acks arrived meanwhile
}

func (b *fakeBroker) Ack(tag uint64, multiple bool) error {
	if h := b.sendHook; h != nil {
		h()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.frames++
	if !b.unacked[tag] {
		// RabbitMQ closes the channel: PRECONDITION_FAILED, unknown
		// delivery tag (a double ack, or a multiple ack overtaken).
		b.t.Errorf("ack(%d, multiple=%v) of a delivery the broker no longer holds", tag, multiple)
	}
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

func TestAckerCoalescesFromTheFront(t *testing.T) {
	b := newFakeBroker(t)
	a := newAcker(b)
	for tag := uint64(1); tag <= 6; tag++ {
		b.deliver(a, tag)
	}
	b.appAck(a, 2)
	require.Zero(t, b.frames, "2 is behind 1, still in progress: held")
	b.appAck(a, 1)
	require.Equal(t, 1, b.frames, "1 and 2 in one multiple ack, at once")
	require.Equal(t, map[uint64]bool{3: true, 4: true, 5: true, 6: true}, b.unacked)

	b.appAck(a, 4)
	a.holdOver() // what the hold timer does
	require.Equal(t, 2, b.frames, "4 sent alone once the hold is over")
	require.Equal(t, map[uint64]bool{3: true, 5: true, 6: true}, b.unacked)

	b.appAck(a, 3)
	require.Equal(t, 3, b.frames)
	require.Equal(t, map[uint64]bool{5: true, 6: true}, b.unacked)

	b.nack(a, 5)
	b.appAck(a, 6)
	require.Equal(t, 4, b.frames)
	require.Empty(t, b.unacked)

	a.close()
	b.deliver(a, 7)
	b.appAck(a, 7)
	require.Equal(t, map[uint64]bool{7: true}, b.unacked, "nothing is sent after close")
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
				case r == 9:
					a.holdOver()
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

// Many goroutines acking at once, as a batch consumer's settle
// goroutines do: every ack reaches the broker, none too early.
func TestAckerConcurrent(t *testing.T) {
	b := newFakeBroker(t)
	a := newAcker(b)
	const n = 2000
	for tag := uint64(1); tag <= n; tag++ {
		b.deliver(a, tag)
	}
	perm := rand.Perm(n)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				b.appAck(a, uint64(perm[i]+1))
			}
		}()
	}
	wg.Wait()
	a.close() // sends what the hold timer has not sent yet
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Empty(t, b.unacked)
	t.Logf("%d acks in %d frames", n, b.frames)
}
