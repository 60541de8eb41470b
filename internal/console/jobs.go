package console

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/claimtx/claimtx/internal/dlq"
)

// maxJobRows bounds the letters a job remembers for its result page; its
// totals count them all.
const maxJobRows = 5000

// job is a replay running in the background, under the console's context
// (not the request's): it outlives the POST that started it and is
// cancelled by Console.Close. internal/dlq makes an interruption safe:
// the batch in flight is settled, and every letter is still in the
// destination, republished, or both.
type job struct {
	ID       string
	Consumer string
	Started  time.Time

	mu       sync.Mutex
	total    int64 // letters in the destination when opened
	totals   dlq.Totals
	rows     []letterRow
	more     int64
	finished time.Time
	err      error
}

// jobView is a consistent copy of a job for its page.
type jobView struct {
	ID, Consumer     string
	Started, Ended   time.Time
	Running, Failed  bool
	Status           string
	Seen, Total      int64
	Totals           dlq.Totals
	Rows             []letterRow
	More             int64
	Passed, Kept     int64
	NotSelectedOther int64
}

func (j *job) view() jobView {
	j.mu.Lock()
	defer j.mu.Unlock()
	v := jobView{ID: j.ID, Consumer: j.Consumer, Started: j.Started, Ended: j.finished, Seen: j.totals.Seen, Total: j.total,
		Totals: j.totals, Rows: j.rows, More: j.more}
	switch {
	case j.finished.IsZero():
		v.Running, v.Status = true, "running"
	case j.err != nil:
		v.Failed, v.Status = true, "failed: "+j.err.Error()
	default:
		v.Status = "done"
	}
	for _, r := range j.rows {
		switch {
		case r.Replayed:
		case r.Action == string(dlq.ActionPass):
			v.Passed++
		default:
			v.Kept++
		}
	}
	return v
}

// jobs holds the running and the last maxJobs finished jobs.
type jobs struct {
	mu      sync.Mutex
	wg      sync.WaitGroup
	byID    map[string]*job
	order   []string
	running map[string]string // consumer -> job id
}

// errBusy is a second replay for a consumer while one runs.
var errBusy = errors.New("a replay of this consumer is running")

// start registers a job for consumer, or returns errBusy with the id of
// the running one.
func (js *jobs) start(consumer string) (*job, string, error) {
	js.mu.Lock()
	defer js.mu.Unlock()
	if id, ok := js.running[consumer]; ok {
		return nil, id, errBusy
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	j := &job{ID: hex.EncodeToString(b), Consumer: consumer, Started: time.Now()}
	js.byID[j.ID] = j
	js.order = append(js.order, j.ID)
	js.running[consumer] = j.ID
	// Forget the oldest finished jobs beyond maxJobs.
	for len(js.order) > maxJobs {
		dropped := false
		for i, id := range js.order {
			if old := js.byID[id]; js.running[old.Consumer] != id {
				delete(js.byID, id)
				js.order = append(js.order[:i], js.order[i+1:]...)
				dropped = true
				break
			}
		}
		if !dropped {
			break
		}
	}
	return j, "", nil
}

func (js *jobs) finish(j *job) {
	js.mu.Lock()
	defer js.mu.Unlock()
	if js.running[j.Consumer] == j.ID {
		delete(js.running, j.Consumer)
	}
}

func (js *jobs) get(id string) *job {
	js.mu.Lock()
	defer js.mu.Unlock()
	return js.byID[id]
}

// replay is POST /dead-letters/replay: it starts the replay of the
// selection in the background and redirects to its page.
func (c *Console) replay(w http.ResponseWriter, r *http.Request) {
	sel := readSelection(r)
	cs := c.consumer(sel.Filters.Consumer)
	switch {
	case cs == nil:
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("no configuration for consumer %q", sel.Filters.Consumer))
		return
	case !sel.All && len(sel.IDs) == 0:
		c.fail(w, r, http.StatusBadRequest, "no letter selected")
		return
	}
	j, running, err := c.jobs.start(cs.Name)
	if err != nil {
		c.render(w, r, http.StatusConflict, "error", page{Title: "Conflict",
			Data: fmt.Sprintf("A replay of %s is running already (job %s): wait for it to finish, then preview again.", cs.Name, running)})
		return
	}
	c.log.Info("console: replay started", "job", j.ID, "consumer", cs.Name, "all_matching", sel.All, "selected", len(sel.IDs), "include_applied", sel.IncludeApplied)
	c.jobs.wg.Go(func() { c.runJob(j, cs, sel) })
	http.Redirect(w, r, "/jobs/"+j.ID, http.StatusSeeOther)
}

func (c *Console) runJob(j *job, cs *Consumer, sel selection) {
	ctx := c.ctx
	err := func() error {
		src, err := c.openDestination(ctx, cs, true)
		if err != nil {
			return err
		}
		defer func() { _ = src.Close() }()
		j.mu.Lock()
		j.total = src.Total()
		j.mu.Unlock()
		run, err := c.selectionRun(ctx, sel, cs, src)
		if err != nil {
			return err
		}
		run.Rate = c.cfg.ReplayRate
		// Batches of 100: the progress moves in visible steps, and an
		// interruption settles at most one small batch.
		run.BatchSize = 100
		run.OnLetter = func(l *dlq.Letter) error {
			if !l.Selected && !l.Replayed {
				return nil
			}
			row := rowOf(l, time.Now())
			j.mu.Lock()
			if len(j.rows) < maxJobRows {
				j.rows = append(j.rows, row)
			} else {
				j.more++
			}
			j.mu.Unlock()
			return nil
		}
		run.OnBatch = func(t dlq.Totals) {
			j.mu.Lock()
			j.totals = t
			j.mu.Unlock()
		}
		t, err := run.Replay(ctx)
		j.mu.Lock()
		j.totals = t
		j.mu.Unlock()
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("interrupted by the console's shutdown after %d letters replayed; nothing is lost: preview and replay again", t.Replayed)
		}
		return err
	}()
	j.mu.Lock()
	j.finished, j.err = time.Now(), nil
	if err != nil {
		j.err = errors.New(c.errText(err))
	}
	totals := j.totals
	j.mu.Unlock()
	c.jobs.finish(j)
	if err != nil {
		c.log.Warn("console: replay failed", "job", j.ID, "consumer", cs.Name, "replayed", totals.Replayed, "err", c.errText(err))
		return
	}
	c.log.Info("console: replay done", "job", j.ID, "consumer", cs.Name, "replayed", totals.Replayed, "read", totals.Seen)
}

// jobPage is GET /jobs/{id}: progress while the replay runs (the page
// refreshes itself every second), the result of every letter afterwards.
func (c *Console) jobPage(w http.ResponseWriter, r *http.Request) {
	j := c.jobs.get(r.PathValue("id"))
	if j == nil {
		c.fail(w, r, http.StatusNotFound, "no such replay job (the console keeps the last 20, in memory: a restart forgets them)")
		return
	}
	v := j.view()
	c.render(w, r, http.StatusOK, "job", page{Title: "Replay", Nav: "dead-letters", Refresh: v.Running, Data: v})
}
