package main

import (
	"io"
	"os"
	"strings"
	"time"

	"github.com/claimtx/claimtx/store"
)

// Progress redraw intervals: a bar may redraw often, a log should stay
// readable (and small) over an hour-long cleanup.
const (
	barInterval = 100 * time.Millisecond
	logInterval = 5 * time.Second
	barWidth    = 30
)

// isTerminal reports whether w is a character device (an interactive
// terminal). golang.org/x/term is not a dependency of claimtx; the mode
// bit is all a progress bar needs to know.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// barOrLog is what --progress auto shows on w: a bar on a terminal, log
// lines otherwise.
func barOrLog(w io.Writer) string {
	if isTerminal(w) {
		return "bar"
	}
	return "log"
}

// redrawInterval is how often a progress display in mode may redraw.
func redrawInterval(mode string) time.Duration {
	if mode == "bar" {
		return barInterval
	}
	return logInterval
}

// progressPrinter renders store.CleanupProgress as a redrawn bar with rate
// and ETA (mode "bar"), as throttled log lines ("log"), or not at all.
// With no counted total it shows a spinner, the count and the rate, and no
// percentage or ETA: the planner's estimate was 2-3x off on a table cleaned
// before, so no total is better than that one.
type progressPrinter struct {
	w      io.Writer
	mode   string
	now    func() time.Time
	last   time.Time
	drawn  bool
	frames int
	latest store.CleanupProgress
	// total is the exact number of claims to delete, when counted.
	total   int64
	counted bool
}

func (p *progressPrinter) update(pr store.CleanupProgress) {
	p.latest = pr
	if p.mode == "none" {
		return
	}
	now := p.now()
	if pr.Batch != 0 && pr.BatchRows != 0 && now.Sub(p.last) < redrawInterval(p.mode) {
		return
	}
	p.last = now
	p.draw(pr)
}

func (p *progressPrinter) draw(pr store.CleanupProgress) {
	rate := 0.0
	if s := pr.Elapsed.Seconds(); s > 0 {
		rate = float64(pr.Deleted) / s
	}
	done := pr.Batch > 0 && pr.BatchRows == 0
	if !p.counted {
		p.drawUncounted(pr, rate, done)
		return
	}
	eta := "?"
	if left := p.total - pr.Deleted; rate > 0 && left > 0 {
		eta = time.Duration(float64(left) / rate * float64(time.Second)).Round(time.Second).String()
	} else if done {
		eta = "0s"
	}
	switch p.mode {
	case "bar":
		frac := 1.0
		if p.total > 0 {
			frac = min(float64(pr.Deleted)/float64(p.total), 1)
		}
		if done {
			frac = 1
		}
		full := int(frac * barWidth)
		printf(p.w, "\r\033[K[%s%s] %3.0f%%  %d/%d claims  %.0f/s  ETA %s",
			strings.Repeat("#", full), strings.Repeat(".", barWidth-full), frac*100, pr.Deleted, p.total, rate, eta)
		p.drawn = true
	case "log":
		if pr.Batch == 0 {
			printf(p.w, "cleanup: %d claims processed before %s to delete, first batch %d rows\n",
				p.total, pr.Horizon.UTC().Format(time.RFC3339), pr.NextBatchSize)
			return
		}
		printf(p.w, "cleanup: %d of %d claims deleted in %d batches, %.0f claims/s, last batch %d rows in %s, next %d, ETA %s\n",
			pr.Deleted, p.total, pr.Batch, rate, pr.BatchRows, pr.BatchDuration.Round(time.Millisecond), pr.NextBatchSize, eta)
	}
}

// drawUncounted shows what is known when the total is not: a spinner (so a
// slow batch does not look like a hang), the count and the rate.
func (p *progressPrinter) drawUncounted(pr store.CleanupProgress, rate float64, done bool) {
	switch p.mode {
	case "bar":
		spin := "|/-\\"[p.frames%4]
		if done {
			spin = ' '
		}
		p.frames++
		printf(p.w, "\r\033[K%c %d claims deleted in %d batches  %.0f/s  %s elapsed",
			spin, pr.Deleted, pr.Batch, rate, pr.Elapsed.Round(time.Second))
		p.drawn = true
	case "log":
		if pr.Batch == 0 {
			printf(p.w, "cleanup: deleting the claims processed before %s (too many to count in %s: no total), first batch %d rows\n",
				pr.Horizon.UTC().Format(time.RFC3339), countBudget, pr.NextBatchSize)
			return
		}
		printf(p.w, "cleanup: %d claims deleted in %d batches, %.0f claims/s, last batch %d rows in %s, next %d\n",
			pr.Deleted, pr.Batch, rate, pr.BatchRows, pr.BatchDuration.Round(time.Millisecond), pr.NextBatchSize)
	}
}

// finish ends the bar's line so the summary starts on its own.
func (p *progressPrinter) finish() {
	if p.mode == "bar" && p.drawn {
		p.draw(p.latest)
		printlnTo(p.w)
	}
}
