package committedkeys_test

import (
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/internal/committedkeys"
)

// clock is a settable clock for the tests: no sleeps.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }

func TestDisabled(t *testing.T) {
	t.Parallel()
	for _, c := range []*committedkeys.Cache{committedkeys.New(0, time.Minute, nil), committedkeys.New(10, 0, nil), committedkeys.New(-1, time.Minute, nil)} {
		require.Nil(t, c)
		h := c.Key("c", 0, "k")
		c.Add(h)
		require.False(t, c.Contains(h))
		require.Zero(t, c.Len())
	}
}

func TestKeyDistinguishesConsumerDayKey(t *testing.T) {
	t.Parallel()
	c := committedkeys.New(100, time.Minute, nil)
	seen := map[committedkeys.Hash]string{}
	for _, tr := range []struct {
		consumer string
		day      int64
		key      string
	}{{"a", 0, "bc"}, {"ab", 0, "c"}, {"a", 1, "bc"}, {"a", 0, "b"}, {"", 0, "abc"}, {"abc", 0, ""}} {
		h := c.Key(tr.consumer, tr.day, tr.key)
		require.Equal(t, h, c.Key(tr.consumer, tr.day, tr.key), "deterministic")
		label := fmt.Sprint(tr)
		require.NotContains(t, seen, h, "%s and %s share a hash", label, seen[h])
		seen[h] = label
	}
	// Another cache draws other seeds.
	require.NotEqual(t, c.Key("a", 0, "k"), committedkeys.New(100, time.Minute, nil).Key("a", 0, "k"))
}

func TestExpiresAfterTTL(t *testing.T) {
	t.Parallel()
	var clk clock
	c := committedkeys.New(100, 10*time.Minute, clk.now)
	h := c.Key("c", 0, "k")
	require.False(t, c.Contains(h))
	c.Add(h)
	require.True(t, c.Contains(h))
	clk.add(10*time.Minute - 1)
	require.True(t, c.Contains(h), "live until the TTL has passed")
	// A second confirmation does not extend the entry: its age is from
	// the first.
	c.Add(h)
	clk.add(1)
	require.False(t, c.Contains(h), "expired at the TTL")
	// Expired entries are dropped by the next Add, and a key added again
	// lives a new TTL.
	c.Add(h)
	require.Equal(t, 1, c.Len())
	require.True(t, c.Contains(h))
	clk.add(10*time.Minute - 1)
	require.True(t, c.Contains(h))
	clk.add(1)
	require.False(t, c.Contains(h))
	c.Add(c.Key("c", 0, "other"))
	require.Equal(t, 1, c.Len(), "the expired entry is gone")
}

func TestEvictsOldestWhenFull(t *testing.T) {
	t.Parallel()
	var clk clock
	c := committedkeys.New(4, time.Hour, clk.now)
	h := func(i int) committedkeys.Hash { return c.Key("c", 0, strconv.Itoa(i)) }
	for i := range 4 {
		c.Add(h(i))
		clk.add(time.Second)
	}
	require.Equal(t, 4, c.Len())
	c.Add(h(4))
	require.Equal(t, 4, c.Len(), "bounded")
	require.False(t, c.Contains(h(0)), "the oldest went")
	for i := 1; i <= 4; i++ {
		require.True(t, c.Contains(h(i)), "key %d", i)
	}
	// Re-adding a live key does not take a slot.
	c.Add(h(4))
	require.True(t, c.Contains(h(1)))
}

// A big cache is sharded; the bound holds over all shards (each shard
// holds its share).
func TestBoundSharded(t *testing.T) {
	t.Parallel()
	const size = 100_000
	c := committedkeys.New(size, time.Hour, nil)
	for i := range 3 * size {
		c.Add(c.Key("c", 0, strconv.Itoa(i)))
	}
	require.LessOrEqual(t, c.Len(), size+64)
	require.Greater(t, c.Len(), size*9/10)
	require.True(t, c.Contains(c.Key("c", 0, strconv.Itoa(3*size-1))), "the newest stays")
}

func TestConcurrent(t *testing.T) {
	t.Parallel()
	c := committedkeys.New(10_000, time.Hour, nil)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5000 {
				h := c.Key("c", 0, strconv.Itoa(g*5000+i))
				c.Add(h)
				c.Contains(h)
				c.Contains(c.Key("c", 0, strconv.Itoa(i)))
			}
		}()
	}
	wg.Wait()
	require.LessOrEqual(t, c.Len(), 10_000+64)
}

// BenchmarkMemory fills a cache of 1M entries and reports the heap it
// holds per entry: go test -run '^$' -bench Memory -benchtime 1x ./internal/committedkeys
func BenchmarkMemory(b *testing.B) {
	const n = 1_000_000
	keys := make([]committedkeys.Hash, n)
	for b.Loop() {
		c := committedkeys.New(n, time.Hour, nil)
		for i := range keys {
			keys[i] = c.Key("loyalty", 0, "order-completed:"+strconv.Itoa(i))
		}
		before := heap()
		for _, h := range keys {
			c.Add(h)
		}
		after := heap()
		runtime.KeepAlive(c)
		b.ReportMetric(float64(after-before)/n, "bytes/entry")
		b.ReportMetric(float64(c.Len()), "entries")
	}
}

func heap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkHit measures a hit (hash + lookup) from parallel goroutines,
// for contention: go test -run '^$' -bench Hit -cpu 1,4,16 ./internal/committedkeys
func BenchmarkHit(b *testing.B) {
	c := committedkeys.New(100_000, time.Hour, nil)
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = "order-completed:" + strconv.Itoa(i)
		c.Add(c.Key("loyalty", 0, keys[i]))
	}
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if !c.Contains(c.Key("loyalty", 0, keys[i&4095])) {
				b.Fatal("miss")
			}
			i++
		}
	})
}

// BenchmarkAdd measures adding new keys (what every applied message costs)
// from parallel goroutines.
func BenchmarkAdd(b *testing.B) {
	c := committedkeys.New(100_000, time.Hour, nil)
	var next atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Add(c.Key("loyalty", 0, "order-completed:"+strconv.FormatInt(next.Add(1), 10)))
		}
	})
}

// Hits on keys read ahead are counted, once each hit, and only theirs.
func TestReadHits(t *testing.T) {
	t.Parallel()
	var clk clock
	c := committedkeys.New(100, time.Minute, clk.now)
	own, read := c.Key("c", 0, "own"), c.Key("c", 0, "read")
	c.Add(own)
	c.AddRead(read, false)
	c.AddRead(own, true) // live already: stays an entry of its own
	for range 3 {
		require.True(t, c.Contains(own))
		require.True(t, c.Contains(read))
	}
	require.False(t, c.Contains(c.Key("c", 0, "absent")))
	require.EqualValues(t, 3, c.TakeReadHits())
	require.Zero(t, c.TakeReadHits())
	clk.add(time.Minute)
	require.False(t, c.Contains(read), "a key read ahead expires like any")
	require.Zero(t, c.TakeReadHits())
	var none *committedkeys.Cache
	none.AddRead(read, true)
	require.Zero(t, none.TakeReadHits())
}

// A mark says so on its first hit only; an entry already live keeps what
// it was.
func TestReadMark(t *testing.T) {
	t.Parallel()
	var clk clock
	c := committedkeys.New(100, time.Minute, clk.now)
	marked, plain, own := c.Key("c", 0, "m"), c.Key("c", 0, "p"), c.Key("c", 0, "o")
	c.Add(own)
	c.AddRead(own, true)
	c.AddRead(marked, true)
	c.AddRead(plain, false)
	hit, mark := c.Lookup(marked)
	require.True(t, hit)
	require.True(t, mark)
	for _, h := range []committedkeys.Hash{marked, plain, own} {
		hit, mark = c.Lookup(h)
		require.True(t, hit)
		require.False(t, mark)
	}
	clk.add(time.Minute - 4)
	require.True(t, c.Contains(marked), "the flags do not shorten an entry's life by more than their bits")
	clk.add(4)
	require.False(t, c.Contains(marked))
}
