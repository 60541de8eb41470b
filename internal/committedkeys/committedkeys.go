// Package committedkeys is the committed-key cache of the claim
// middleware (docs/operations.md#committed-key-cache): the keys whose
// claims this process saw committed, so a duplicate storm is answered in
// process. It only says "committed", never "new": a miss goes to the
// database. Entries expire well inside the claim retention, so a claim
// still exists for every live entry unless someone deleted it early.
//
// Entries are two independent 64-bit maphash values of (consumer, event
// day, key) under random per-cache seeds: memory does not grow with key
// length, and a false hit needs a 128-bit collision an attacker cannot aim
// at without the seeds.
package committedkeys

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of middleware.Claim's CommittedKeys and CommittedKeysTTL,
// here so that framework/consumer can cap the TTL by its Retention.
const (
	// DefaultSize: about 6 MB (BenchmarkMemory), the last minutes of a
	// replay at thousands of messages per second.
	DefaultSize = 100_000
	// DefaultTTL covers redeliveries after a rebalance and a producer's
	// re-sends, a fraction of any claim retention the store accepts.
	DefaultTTL = 10 * time.Minute
)

// Hash identifies one (consumer, event day, key).
type Hash [2]uint64

// entry is one insertion, in insertion order.
type entry struct {
	h Hash
	// at is when the entry was added, in nanoseconds since the cache's
	// epoch, its two lowest bits the flags below (3 ns of precision rather
	// than 8 bytes more per entry).
	at int64
}

// Entry flags, in entry.at's lowest bits.
const (
	readBit  = 1 << iota // added by AddRead
	markBit              // AddRead's mark, not hit yet
	flagBits = readBit | markBit
)

// added is when e was added, without its flags.
func (e entry) added() int64 { return e.at &^ flagBits }

// maxShards bounds the shards, each with its own lock; minPerShard keeps
// small caches in one shard, whose bound is exact.
const (
	maxShards   = 64
	minPerShard = 1024
)

// Cache is a bounded set of hashes that expire. The zero value is not
// usable; a nil *Cache is an empty cache that keeps nothing.
type Cache struct {
	ttl      int64
	now      func() time.Time
	epoch    time.Time
	s1, s2   maphash.Seed
	mask     uint64
	shards   []shard
	readHits atomic.Int64 // hits on entries added by AddRead
}

// shard holds its entries in a ring in insertion order (expiry and
// eviction go oldest first), indexed by the hash's first half; a lookup
// compares all 128 bits. Of two live hashes sharing a first half only the
// newer is indexed: the older misses (a round trip, never a wrong answer),
// and its slot, like an expired entry's re-added twin, only drops itself.
type shard struct {
	mu   sync.Mutex
	m    map[uint64]uint32
	ring []entry // circular once it reached max
	head int     // oldest slot
	n    int     // occupied ring slots
	max  int
	_    [64]byte // keep neighbouring shards' locks off one cache line
}

// New returns a cache of at most size entries, each kept ttl; now is its
// clock (time.Now when nil). size <= 0 or ttl <= 0 returns nil: no cache.
func New(size int, ttl time.Duration, now func() time.Time) *Cache {
	if size <= 0 || ttl <= 0 {
		return nil
	}
	if now == nil {
		now = time.Now
	}
	n := 1
	for n < maxShards && size/(2*n) >= minPerShard {
		n *= 2
	}
	c := &Cache{ttl: int64(ttl), now: now, epoch: now(), s1: maphash.MakeSeed(), s2: maphash.MakeSeed(), mask: uint64(n - 1), shards: make([]shard, n)}
	per := (size + n - 1) / n
	for i := range c.shards {
		c.shards[i] = shard{m: map[uint64]uint32{}, max: per}
	}
	return c
}

// Key hashes (consumer, day, key); day is the event day in Unix days, 0
// for none.
func (c *Cache) Key(consumer string, day int64, key string) Hash {
	if c == nil {
		return Hash{}
	}
	return Hash{c.sum(c.s1, consumer, day, key), c.sum(c.s2, consumer, day, key)}
}

// sum is one 64-bit hash. The consumer's length comes first and the key
// last, so no two distinct triples write the same bytes.
func (c *Cache) sum(seed maphash.Seed, consumer string, day int64, key string) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], uint64(len(consumer)))
	binary.LittleEndian.PutUint64(buf[8:], uint64(day))
	_, _ = h.Write(buf[:8])
	_, _ = h.WriteString(consumer)
	_, _ = h.Write(buf[8:])
	_, _ = h.WriteString(key)
	return h.Sum64()
}

func (c *Cache) clock() int64 { return int64(c.now().Sub(c.epoch)) }

func (c *Cache) shard(h Hash) *shard { return &c.shards[h[0]&c.mask] }

// Lookup reports whether h was added less than the ttl ago and not
// evicted since, and whether it was the first hit on an AddRead mark.
func (c *Cache) Lookup(h Hash) (hit, mark bool) {
	if c == nil {
		return false, false
	}
	now := c.clock()
	s := c.shard(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.lookup(h)
	if !ok || now-s.ring[i].added() >= c.ttl {
		return false, false
	}
	e := &s.ring[i]
	if e.at&readBit != 0 {
		c.readHits.Add(1)
	}
	mark = e.at&markBit != 0
	e.at &^= markBit // the first hit only
	return true, mark
}

// TakeReadHits returns the hits on entries added by AddRead since the
// last call: how much of what was read ahead the stream asked for.
func (c *Cache) TakeReadHits() int64 {
	if c == nil {
		return 0
	}
	return c.readHits.Swap(0)
}

// Add records h as committed now, evicting the oldest entry of its shard
// when full. A live entry is left as it is: its age counts from the
// database's first answer.
func (c *Cache) Add(h Hash) { c.add(h, 0) }

// AddRead is Add for a key read ahead of the stream; hits on it are
// counted for TakeReadHits. With mark, the first hit on it says so
// (Lookup): time to read further.
func (c *Cache) AddRead(h Hash, mark bool) {
	if mark {
		c.add(h, readBit|markBit)
	} else {
		c.add(h, readBit)
	}
}

func (c *Cache) add(h Hash, flag int64) {
	if c == nil {
		return
	}
	now := c.clock()
	s := c.shard(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(now - c.ttl)
	if i, ok := s.lookup(h); ok && now-s.ring[i].added() < c.ttl {
		return
	}
	if s.n == s.max {
		s.pop()
	}
	s.m[h[0]] = uint32(s.push(entry{h: h, at: now&^flagBits | flag}))
}

// expire drops the entries added at or before cutoff, oldest first.
func (s *shard) expire(cutoff int64) {
	for s.n > 0 && s.ring[s.head].added() <= cutoff {
		s.pop()
	}
}

// lookup returns the ring slot holding h.
func (s *shard) lookup(h Hash) (int, bool) {
	i, ok := s.m[h[0]]
	if !ok || s.ring[i].h != h {
		return 0, false
	}
	return int(i), true
}

// pop drops the oldest ring slot, and its index entry unless the index
// points to a newer slot.
func (s *shard) pop() {
	e := s.ring[s.head]
	if i, ok := s.m[e.h[0]]; ok && int(i) == s.head {
		delete(s.m, e.h[0])
	}
	s.ring[s.head] = entry{}
	s.head = (s.head + 1) % len(s.ring)
	s.n--
}

// push appends at the newest end and returns the slot, growing a full
// ring below max (doubling, re-indexing the slots that move).
func (s *shard) push(e entry) int {
	if s.n == len(s.ring) {
		grown := make([]entry, min(max(2*len(s.ring), 16), s.max))
		for i := 0; i < s.n; i++ {
			old := (s.head + i) % len(s.ring)
			grown[i] = s.ring[old]
			if j, ok := s.m[grown[i].h[0]]; ok && int(j) == old {
				s.m[grown[i].h[0]] = uint32(i)
			}
		}
		s.ring, s.head = grown, 0
	}
	i := (s.head + s.n) % len(s.ring)
	s.ring[i] = e
	s.n++
	return i
}
