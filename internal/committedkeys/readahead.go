package committedkeys

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
)

// Read-ahead bounds. A read is one statement returning up to a page of
// keys: a round trip plus about a microsecond per key, where a duplicate
// without it costs two round trips.
const (
	// readAheadAfter duplicates in a row from the database, and no new
	// claim among them, start reading ahead: a redelivery now and then
	// does not. Once reads pay, the next one starts at the next duplicate
	// the database answers (the stream ran past what was read).
	readAheadAfter = 8
	// readAheadMaxAfter caps the backoff when reads do not pay (a replay
	// out of the order its messages were first applied in): then at most
	// one short read per this many duplicates.
	readAheadMaxAfter = 1024
	// A first read asks for half the largest page: eight duplicates in a
	// row are the start of a replay more often than not, and one read too
	// many costs a few milliseconds once. After a read that did not pay,
	// the smallest.
	readAheadMinPage = 256
	readAheadMaxPage = 8192
	// readAheadPays: a read paid when hits on its keys (and earlier
	// reads') before the next read reached this fraction of its page. A
	// page costs about what a few duplicates answered by the database
	// cost, and consumers that replay in parallel (Kafka partitions) use
	// a page each a slice at a time.
	readAheadPays = 16
	// readAheadMark: the key this far into a full page is marked; the
	// stream reaching it starts the next read, from the page's end, while
	// the rest of the page still answers.
	readAheadMark = 4
)

// ReadAhead fills the committed-key cache ahead of a replay that started
// cold: a group reset to an old offset (the group must be stopped for
// that, so every consumer starts with an empty cache), a producer
// re-sending a range, a restart in the middle of a storm. Once the
// database answers "duplicate" readAheadAfter times in a row, the
// middleware reads the keys of the claims written after the earliest of
// those duplicates (Following) into the cache, so the next
// messages of the replay are answered in process. A key a quarter into
// each full page is marked: the first message to hit it reads the next
// page, from the end of this one, as a file system reads ahead of a
// sequential reader.
//
// It caches what the database showed committed, as the cache always has:
// a statement outside a transaction sees only committed claims. It adapts:
// a read whose keys the stream asked for doubles the next page and makes
// the next duplicate from the database start a read; one it did not ask
// for resets the page and doubles the duplicates needed first.
//
// A read runs on the goroutine of the message that started it, after its
// transaction ended, so it has no lifetime of its own; one read at a
// time, the other messages go on meanwhile.
type ReadAhead struct {
	cache     *Cache
	following Following
	consumer  string
	logger    watermill.LoggerAdapter
	maxPage   int
	// reads counts the reads finished: a duplicate whose round trip saw
	// one finish may be covered by it, and starts none itself.
	reads atomic.Uint64
	// streak counts the database's answers in a row that were
	// duplicates; an atomic, so that a new claim (every message in
	// normal operation) ends it without taking mu.
	streak atomic.Int64

	mu       sync.Mutex
	after    int    // the streak that starts the next read
	page     int    // the size of the next read
	lastPage int    // the size of the last read, 0 before the first
	end      string // the last key of the last read when it was full
	busy     bool   // a read is running
}

// Following reads ahead of a replay: the keys of consumer's committed
// claims after the earliest claim among anchors, at most n, each passed
// to add (the store's read, pg.Claims.Following).
type Following func(ctx context.Context, consumer string, anchors []string, n int, add func(key string)) error

// NewReadAhead returns the read-ahead of consumer's claims into cache, of
// size entries; nil (no read-ahead) without a cache, or with one too small
// to hold a page without evicting the entries in use.
func NewReadAhead(cache *Cache, size int, consumer string, logger watermill.LoggerAdapter, following Following) *ReadAhead {
	if cache == nil {
		return nil
	}
	maxPage := min(readAheadMaxPage, size/8)
	if maxPage < readAheadMinPage {
		return nil
	}
	return &ReadAhead{cache: cache, following: following, consumer: consumer, logger: logger,
		maxPage: maxPage, after: readAheadAfter, page: maxPage / 2}
}

// Marked reads the next page: the stream hit the mark of the last one.
func (r *ReadAhead) Marked(ctx context.Context) {
	if r == nil {
		return
	}
	r.mu.Lock()
	if r.busy || r.end == "" {
		r.mu.Unlock()
		return
	}
	// The stream reached the mark: the read paid.
	r.page = min(2*r.page, r.maxPage)
	r.after = 1
	r.read(ctx, []string{r.end})
}

// Started returns what Answered needs to know of the reads when a
// message's claim transaction begins.
func (r *ReadAhead) Started() uint64 {
	if r == nil {
		return 0
	}
	return r.reads.Load()
}

// Answered records what a committed claim transaction that began at
// Started learnt: dups, the keys it found claimed by committed
// transactions, and whether it claimed any key itself. A new claim ends
// the streak: the stream is not (or no longer) a replay.
func (r *ReadAhead) Answered(ctx context.Context, began uint64, dups []string, claimedAny bool) {
	if r == nil {
		return
	}
	if claimedAny {
		if r.streak.Load() != 0 {
			r.streak.Store(0)
		}
		return
	}
	streak := r.streak.Add(int64(len(dups)))
	r.mu.Lock()
	if r.busy || streak < int64(r.after) || len(dups) == 0 || r.reads.Load() != began {
		r.mu.Unlock()
		return
	}
	anchors := dups
	if r.lastPage > 0 {
		if r.cache.TakeReadHits() >= int64(r.lastPage/readAheadPays) {
			r.after, r.page = 1, min(2*r.page, r.maxPage)
			// The stream ran past the last page: go on from its end, not
			// from this duplicate, which consumers replaying in parallel
			// may have run ahead to, leaving the keys in between to the
			// database.
			if r.end != "" {
				anchors = []string{r.end}
			}
		} else {
			r.after, r.page = min(max(2*r.after, 2*readAheadAfter), readAheadMaxAfter), readAheadMinPage
		}
	}
	r.read(ctx, anchors)
}

// read reads a page from the anchors on; it is called with r.mu held and
// releases it.
func (r *ReadAhead) read(ctx context.Context, anchors []string) {
	page := r.page
	r.busy, r.lastPage = true, page
	r.streak.Store(0)
	r.cache.TakeReadHits()
	r.mu.Unlock()

	n, last := 0, ""
	err := r.following(ctx, r.consumer, anchors, page, func(k string) {
		n++
		r.cache.AddRead(r.cache.Key(r.consumer, 0, k), n == page/readAheadMark)
		last = k
	})
	failed := err != nil && ctx.Err() == nil
	if failed {
		// Only an optimisation: the messages go to the database instead,
		// and the next read waits as long as after reads that did not pay.
		r.logger.Error("claimtx: committed-key read-ahead failed; duplicates are answered by the database", err, watermill.LogFields{"consumer": r.consumer})
	}
	r.mu.Lock()
	r.busy, r.end = false, ""
	switch {
	case failed:
		r.after, r.page = readAheadMaxAfter, readAheadMinPage
	case err == nil && n == page:
		r.end = last
	}
	r.mu.Unlock()
	r.reads.Add(1)
}
