package claimtxcli

import (
	"io"
	"os"
	"strings"
	"time"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
	"github.com/claimtx/claimtx/store"
)

// A bar may redraw often; a log stays readable over an hour-long cleanup.
const (
	barInterval = 100 * time.Millisecond
	logInterval = 5 * time.Second
	barWidth    = 30
)

// isTerminal: w is a character device (golang.org/x/term is not a
// dependency; the mode bit is all a bar needs).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// barOrLog is what --progress auto shows on w.
func barOrLog(w io.Writer) string {
	if isTerminal(w) {
		return "bar"
	}
	return "log"
}

// progress is what the displays of cleanup and dlq share: the mode, the
// throttling and the bar. A library bar would draw its own line, which
// tests and scripts read.
type progress struct {
	w     io.Writer
	mode  string
	now   func() time.Time
	last  time.Time
	drawn bool
}

// due says whether a redraw is due (always when force), and records it.
func (p *progress) due(force bool) bool {
	if p.mode == "none" {
		return false
	}
	now := p.now()
	interval := logInterval
	if p.mode == "bar" {
		interval = barInterval
	}
	if !force && now.Sub(p.last) < interval {
		return false
	}
	p.last = now
	return true
}

func (p *progress) bar(frac float64, format string, a ...any) {
	full := int(frac * barWidth)
	printf(p.w, "\r\033[K[%s%s] %3.0f%%  "+format, append([]any{strings.Repeat("#", full), strings.Repeat(".", barWidth-full), frac * 100}, a...)...)
	p.drawn = true
}

func (p *progress) clear() {
	if p.mode == "bar" && p.drawn {
		printTo(p.w, "\r\033[K")
		p.drawn = false
	}
}

// rateETA is the rate of n done in elapsed and the time left to total:
// "?" when unknown, "0s" when done.
func rateETA(n, total int64, elapsed time.Duration, done bool) (float64, string) {
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(n) / s
	}
	eta := "?"
	if left := total - n; rate > 0 && left > 0 {
		eta = time.Duration(float64(left) / rate * float64(time.Second)).Round(time.Second).String()
	} else if done {
		eta = "0s"
	}
	return rate, eta
}

func fraction(n, total int64) float64 {
	if total > 0 {
		return min(float64(n)/float64(total), 1)
	}
	return 1
}

// progressPrinter shows cleanup's progress. Without a counted total it
// shows a spinner, the count and the rate: the planner's estimate was 2-3x
// off on a table cleaned before.
type progressPrinter struct {
	progress
	frames  int
	latest  store.CleanupResult
	total   int64 // exact, when counted
	counted bool
}

func (p *progressPrinter) update(pr store.CleanupResult) {
	p.latest = pr
	if p.due(pr.Batches == 0 || pr.BatchRows == 0) {
		p.draw(pr)
	}
}

func (p *progressPrinter) draw(pr store.CleanupResult) {
	done := pr.Batches > 0 && pr.BatchRows == 0
	rate, eta := rateETA(pr.Deleted, p.total, pr.Duration, done)
	if !p.counted {
		p.drawUncounted(pr, rate, done)
		return
	}
	switch p.mode {
	case "bar":
		frac := fraction(pr.Deleted, p.total)
		if done {
			frac = 1
		}
		p.bar(frac, "%d/%d claims  %.0f/s  ETA %s", pr.Deleted, p.total, rate, eta)
	case "log":
		if pr.Batches == 0 {
			printf(p.w, "cleanup: %d claims processed before %s to delete, first batch %d rows\n",
				p.total, pr.Horizon.UTC().Format(time.RFC3339), pr.NextBatchSize)
			return
		}
		printf(p.w, "cleanup: %d of %d claims deleted in %d batches, %.0f claims/s, last batch %d rows in %s, next %d, ETA %s\n",
			pr.Deleted, p.total, pr.Batches, rate, pr.BatchRows, pr.BatchDuration.Round(time.Millisecond), pr.NextBatchSize, eta)
	}
}

// drawUncounted spins so that a slow batch does not look like a hang.
func (p *progressPrinter) drawUncounted(pr store.CleanupResult, rate float64, done bool) {
	switch p.mode {
	case "bar":
		spin := "|/-\\"[p.frames%4]
		if done {
			spin = ' '
		}
		p.frames++
		printf(p.w, "\r\033[K%c %d claims deleted in %d batches  %.0f/s  %s elapsed",
			spin, pr.Deleted, pr.Batches, rate, pr.Duration.Round(time.Second))
		p.drawn = true
	case "log":
		if pr.Batches == 0 {
			printf(p.w, "cleanup: deleting the claims processed before %s (too many to count in %s: no total), first batch %d rows\n",
				pr.Horizon.UTC().Format(time.RFC3339), countBudget, pr.NextBatchSize)
			return
		}
		printf(p.w, "cleanup: %d claims deleted in %d batches, %.0f claims/s, last batch %d rows in %s, next %d\n",
			pr.Deleted, pr.Batches, rate, pr.BatchRows, pr.BatchDuration.Round(time.Millisecond), pr.NextBatchSize)
	}
}

func (p *progressPrinter) finish() {
	if p.mode == "bar" && p.drawn {
		p.draw(p.latest)
		printlnTo(p.w)
	}
}

// largeDestination: from how many letters --progress auto shows progress.
const largeDestination = 1000

// dlqProgress is on stderr: stdout carries the letters.
type dlqProgress struct {
	progress
	verb  string
	total int64
	start time.Time
}

func (d *dlqFlags) newProgress(total int64) *dlqProgress {
	p := &dlqProgress{progress: progress{w: d.stderr, mode: d.progress, now: time.Now}, total: total, start: time.Now(), verb: "read"}
	if d.sub == "replay" && !d.DryRun {
		p.verb = "replayed"
	}
	if p.mode == "auto" {
		p.mode = "none"
		if total >= largeDestination {
			p.mode = barOrLog(d.stderr)
		}
	}
	return p
}

func (p *dlqProgress) update(t dlq.Totals) {
	if p.due(false) {
		p.draw(t)
	}
}

func (p *dlqProgress) draw(t dlq.Totals) {
	rate, eta := rateETA(t.Seen, p.total, time.Since(p.start), t.Seen >= p.total)
	frac := fraction(t.Seen, p.total)
	switch p.mode {
	case "bar":
		p.bar(frac, "%d/%d letters  %d %s  %.0f/s  ETA %s", t.Seen, p.total, t.Replayed, p.verb, rate, eta)
	case "log":
		printf(p.w, "dlq: %d of %d letters read (%.0f%%), %d selected, %d replayed, %.0f letters/s, ETA %s\n",
			t.Seen, p.total, frac*100, t.Selected, t.Replayed, rate, eta)
	}
}

func (p *dlqProgress) finish(t dlq.Totals) {
	switch {
	case p.mode == "bar":
		p.draw(t)
		printlnTo(p.w)
	case p.mode == "log" && !p.last.IsZero():
		p.draw(t)
	}
}
