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
	// claim among them, start reading ahead. Once reads pay, the next
	// duplicate the database answers starts the next one.
	readAheadAfter = 8
	// readAheadMaxAfter caps the backoff when reads do not pay (a replay
	// out of its first order).
	readAheadMaxAfter = 1024
	// A first read asks for half the largest page (eight duplicates in a
	// row usually start a replay); after a read that did not pay, the
	// smallest.
	readAheadMinPage = 256
	readAheadMaxPage = 8192
	// readAheadPays: a read paid when hits on read keys before the next
	// read reached 1/readAheadPays of its page (a page costs about a few
	// duplicates' round trips, and parallel replays share it).
	readAheadPays = 16
	// readAheadMark: the key 1/readAheadMark into a full page is marked;
	// the stream reaching it starts the next read from the page's end.
	readAheadMark = 4
)

// ReadAhead fills the committed-key cache ahead of a replay that started
// cold (a group reset, a producer re-sending a range). Once the database
// answers "duplicate" readAheadAfter times in a row, it reads the keys of
// the committed claims written after the earliest of those duplicates
// (Following); a marked key in each full page starts the next read, as a
// file system reads ahead. A read that paid doubles the next page; one
// that did not resets it and doubles the duplicates needed first. One read
// at a time runs on the goroutine of the message that started it, after
// its transaction ended.
type ReadAhead struct {
	cache     *Cache
	following Following
	consumer  string
	logger    watermill.LoggerAdapter
	maxPage   int
	// reads counts the reads finished: a duplicate whose round trip saw
	// one finish may be covered by it, and starts none itself.
	reads atomic.Uint64
	// streak counts the database's duplicate answers in a row; atomic, so
	// a new claim (normal operation) ends it without taking mu.
	streak atomic.Int64

	mu       sync.Mutex
	after    int    // the streak that starts the next read
	page     int    // the size of the next read
	lastPage int    // the size of the last read, 0 before the first
	end      string // the last key of the last read when it was full
	busy     bool   // a read is running
}

// Following is pg.Claims.Following.
type Following func(ctx context.Context, consumer string, anchors []string, n int, add func(key string)) error

// NewReadAhead returns the read-ahead of consumer's claims into cache, of
// size entries; nil without a cache or with one too small for a page.
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
	r.after, r.page = 1, min(2*r.page, r.maxPage)
	r.read(ctx, []string{r.end})
}

// Started is what Answered needs to know of the reads when a claim
// transaction begins.
func (r *ReadAhead) Started() uint64 {
	if r == nil {
		return 0
	}
	return r.reads.Load()
}

// Answered records what a committed claim transaction that began at
// Started learnt: dups, the keys it found claimed, and whether it claimed
// any key itself, which ends the streak.
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
			// Go on from the last page's end, not from this duplicate,
			// which parallel replays may have run ahead to.
			if r.end != "" {
				anchors = []string{r.end}
			}
		} else {
			r.after, r.page = min(max(2*r.after, 2*readAheadAfter), readAheadMaxAfter), readAheadMinPage
		}
	}
	r.read(ctx, anchors)
}

// read reads a page from the anchors on; called with r.mu held, it
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
		// Only an optimisation: back off as far as for reads that did not pay.
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
