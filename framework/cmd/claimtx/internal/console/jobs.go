package console

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
)

// maxJobRows bounds the rows a job keeps for its page; totals count all.
const maxJobRows = 5000

// job is a replay, or the dry run of a preview of all matching, under the
// console's context: it outlives its POST and ends with Console.Close.
type job struct {
	ID       string
	Consumer string
	Started  time.Time
	DryRun   bool // a preview: its page is the preview with the confirmation
	sel      selection
	kafka    bool

	mu       sync.Mutex
	total    int64 // letters in the destination when opened
	totals   dlq.Totals
	rows     letterRows
	finished time.Time
	err      error
}

type jobView struct {
	ID, Consumer    string
	Started, Ended  time.Time
	Running, Failed bool
	Status          string
	Seen, Total     int64
	Totals          dlq.Totals
	Rows            []letterRow
	More            int64
	Passed, Kept    int64
	WouldReplay     int64 // dry run
}

func (j *job) view() jobView {
	j.mu.Lock()
	defer j.mu.Unlock()
	v := jobView{ID: j.ID, Consumer: j.Consumer, Started: j.Started, Ended: j.finished, Seen: j.totals.Seen, Total: j.total,
		Totals: j.totals, Rows: j.rows.rows, More: j.rows.more, WouldReplay: j.rows.replay}
	switch {
	case j.finished.IsZero():
		v.Running, v.Status = true, "running"
	case j.err != nil:
		v.Failed, v.Status = true, "failed: "+j.err.Error()
	default:
		v.Status = "done"
	}
	for _, r := range j.rows.rows {
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

func (j *job) locked(f func()) {
	j.mu.Lock()
	defer j.mu.Unlock()
	f()
}

func (j *job) kind() string {
	if j.DryRun {
		return "dry run"
	}
	return "replay"
}

// jobs holds the running and the last maxJobs finished jobs.
type jobs struct {
	mu      sync.Mutex
	wg      sync.WaitGroup
	byID    map[string]*job
	order   []string
	running map[string]string // consumer -> job id
}

var errBusy = errors.New("a job of this consumer is running")

// start registers a job for consumer, or returns errBusy with the running
// one. One job per consumer: on RabbitMQ a browse holds what it read
// unacked, so a replay beside a dry run would miss the letters the dry run
// holds, and a dry run beside a replay would count letters being removed.
// The same dry run asked again joins the running one (reused).
func (js *jobs) start(consumer string, dryRun bool, sel selection) (j *job, reused bool, err error) {
	js.mu.Lock()
	defer js.mu.Unlock()
	if id, ok := js.running[consumer]; ok {
		cur := js.byID[id]
		if dryRun && cur.DryRun && cur.sel.sameAll(sel) {
			return cur, true, nil
		}
		return cur, false, errBusy
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	j = &job{ID: hex.EncodeToString(b), Consumer: consumer, Started: time.Now(), DryRun: dryRun, sel: sel}
	js.byID[j.ID] = j
	js.order = append(js.order, j.ID)
	js.running[consumer] = j.ID
	for len(js.order) > maxJobs {
		i := slices.IndexFunc(js.order, func(id string) bool { return js.running[js.byID[id].Consumer] != id })
		if i < 0 {
			break
		}
		delete(js.byID, js.order[i])
		js.order = slices.Delete(js.order, i, i+1)
	}
	return j, false, nil
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

// replay is POST /dead-letters/replay: it starts a replay job.
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
	c.startJob(w, r, cs, sel, false)
}

// startJob starts a job of sel and redirects to its page; 409 while
// another job of the consumer runs.
func (c *Console) startJob(w http.ResponseWriter, r *http.Request, cs *Consumer, sel selection, dryRun bool) {
	j, reused, err := c.jobs.start(cs.Name, dryRun, sel)
	if err != nil {
		what := "A replay"
		if j.DryRun {
			what = "A dry run (preview of all matching)"
		}
		c.render(w, r, http.StatusConflict, "error", page{Title: "Conflict",
			Data: fmt.Sprintf("%s of %s is running already (job %s, at /jobs/%s): wait for it to finish, then preview again.", what, cs.Name, j.ID, j.ID)})
		return
	}
	if !reused {
		j.kafka = cs.Broker.Kind == brokers.KindKafka
		c.log.Info("console: "+j.kind()+" started", "job", j.ID, "consumer", cs.Name, "all_matching", sel.All, "selected", len(sel.IDs), "include_applied", sel.IncludeApplied)
		c.jobs.wg.Go(func() { c.runJob(j, cs, sel) })
	}
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
		j.locked(func() { j.total = src.Total() })
		run, err := c.selectionRun(ctx, sel, cs, src)
		if err != nil {
			return err
		}
		maxRows := maxJobRows
		if j.DryRun {
			// Rate paces republishing only.
			run.DryRun = true
			maxRows = maxPreviewRows
		} else {
			run.Rate = c.cfg.ReplayRate
		}
		run.OnLetter = func(l *dlq.Letter) error {
			if !l.Selected && !l.Replayed {
				return nil
			}
			row := rowOf(l, time.Now())
			row.Payload = "" // no result page shows it: don't keep it
			j.locked(func() { j.rows.add(l, row, maxRows) })
			return nil
		}
		run.OnBatch = func(t dlq.Totals) { j.locked(func() { j.totals = t }) }
		t, err := run.Replay(ctx)
		j.locked(func() { j.totals = t })
		if err != nil && ctx.Err() != nil {
			if j.DryRun {
				return fmt.Errorf("interrupted by the console's shutdown after %d letters read; a dry run changes nothing: preview again", t.Seen)
			}
			return fmt.Errorf("interrupted by the console's shutdown after %d letters replayed; nothing is lost: preview and replay again", t.Replayed)
		}
		if err != nil && j.DryRun {
			return fmt.Errorf("dry run: %w", err)
		}
		return err
	}()
	j.mu.Lock()
	j.finished, j.err = time.Now(), nil
	if err != nil {
		j.err = errors.New(c.errText(err))
	}
	totals, wouldReplay := j.totals, j.rows.replay
	j.mu.Unlock()
	c.jobs.finish(j)
	kind, count, n := j.kind(), "replayed", totals.Replayed
	if j.DryRun {
		count, n = "would_replay", wouldReplay
	}
	if err != nil {
		c.log.Warn("console: "+kind+" failed", "job", j.ID, "consumer", cs.Name, count, n, "read", totals.Seen, "err", c.errText(err))
		return
	}
	c.log.Info("console: "+kind+" done", "job", j.ID, "consumer", cs.Name, count, n, "read", totals.Seen)
}

// jobPage is GET /jobs/{id}: progress while the job runs, then the result
// of every letter; for a dry run, the preview with its confirmation.
func (c *Console) jobPage(w http.ResponseWriter, r *http.Request) {
	j := c.jobs.get(r.PathValue("id"))
	if j == nil {
		c.fail(w, r, http.StatusNotFound, "no such job (the console keeps the last 20, in memory: a restart forgets them)")
		return
	}
	v := j.view()
	if j.DryRun {
		d := previewData{Consumer: j.Consumer, Selection: j.sel, Rows: v.Rows, More: v.More, Totals: v.Totals,
			Replay: v.WouldReplay, Kafka: j.kafka, Job: &v}
		c.render(w, r, http.StatusOK, "preview", page{Title: "Replay preview", Nav: "dead-letters", Refresh: v.Running, Data: d})
		return
	}
	c.render(w, r, http.StatusOK, "job", page{Title: "Replay", Nav: "dead-letters", Refresh: v.Running, Data: v})
}
