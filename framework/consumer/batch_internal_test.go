package consumer

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
)

func gatherMsgs(n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), nil)
	}
	return msgs
}

// The gather tests run in a synctest bubble: its fake clock makes the
// maxWait timers fire exactly when the test says, not when the scheduler
// gets round to it.

func TestGatherFullBatchesFirst(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ch := make(chan *message.Message, 10)
		for _, m := range gatherMsgs(10) {
			ch <- m
		}
		out := make(chan []*message.Message)
		go func() {
			defer close(out)
			gather(t.Context(), ch, 4, time.Hour, out)
		}()
		require.Len(t, <-out, 4)
		require.Len(t, <-out, 4)
		synctest.Wait() // gather is blocked with what it holds
		select {
		case b := <-out:
			t.Fatalf("a batch of %d before maxWait or the end of input", len(b))
		default:
		}
		close(ch)
		require.Len(t, <-out, 2, "what is left goes out when the input ends")
		_, open := <-out
		require.False(t, open)
	})
}

// While no worker takes the ripe batch, it keeps growing up to max.
func TestGatherGrowsWhileWorkersAreBusy(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ch := make(chan *message.Message)
		out := make(chan []*message.Message)
		go gather(t.Context(), ch, 8, time.Millisecond, out)
		msgs := gatherMsgs(8)
		ch <- msgs[0]
		// The fake clock passes maxWait only once gather is blocked, and
		// gather handles its timer before the clock moves on: when the
		// sleep returns, the batch is ripe and nobody has taken it.
		time.Sleep(5 * time.Millisecond)
		for _, m := range msgs[1:] {
			ch <- m // accepted although ripe: it grows
		}
		require.Equal(t, msgs, <-out)
	})
}

func TestGatherNacksWhatItHoldsOnCancel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	ch := make(chan *message.Message)
	out := make(chan []*message.Message)
	done := make(chan struct{})
	go func() {
		defer close(done)
		gather(ctx, ch, 8, time.Hour, out)
	}()
	msgs := gatherMsgs(3)
	for _, m := range msgs {
		ch <- m
	}
	cancel()
	<-done
	for _, m := range msgs {
		select {
		case <-m.Nacked():
		default:
			t.Fatal("a message held at shutdown was not nacked")
		}
	}
}
