package pg_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/pg"
)

func TestSleep(t *testing.T) {
	t.Parallel()
	require.NoError(t, pg.Sleep(context.Background(), time.Millisecond), "the wait elapsed")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	require.ErrorIs(t, pg.Sleep(ctx, time.Hour), context.Canceled, "the context ended the wait")
	require.Less(t, time.Since(start), time.Minute)
}

func TestEvery(t *testing.T) {
	t.Parallel()
	t.Run("f on every tick until it says stop", func(t *testing.T) {
		t.Parallel()
		calls := make(chan int, 3)
		n := 0
		done := make(chan struct{})
		go func() {
			defer close(done)
			pg.Every(context.Background(), time.Millisecond, func() bool {
				n++
				calls <- n
				return n < 3
			})
		}()
		await(t, done, "Every went on after f returned false")
		close(calls)
		var got []int
		for c := range calls {
			got = append(got, c)
		}
		require.Equal(t, []int{1, 2, 3}, got, "f ran on each tick, none after it returned false")
	})

	t.Run("the context's end stops it", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		called := make(chan struct{}, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			pg.Every(ctx, time.Hour, func() bool { called <- struct{}{}; return true })
		}()
		cancel()
		await(t, done, "Every went on after its context ended")
		require.Empty(t, called, "no tick came before the context ended")
	})
}

// await fails the test rather than hanging it when done is never closed.
func await(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal(what)
	}
}
