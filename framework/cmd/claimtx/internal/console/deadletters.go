package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
)

const (
	// jobBatch letters are what a preview or job holds in memory at once
	// (read whole); a replay's progress moves in visible steps, and an
	// interruption settles at most one small batch.
	jobBatch = 100
	// maxPreviewRows bounds the rows a preview lists; its totals count all.
	maxPreviewRows = 1000
)

// filterForm is the dead-letter filters as the forms carry them.
type filterForm struct {
	Consumer, Reason, Key, Older, Newer string
	Handled                             bool // Kafka: list letters a replay went past too
}

func readFilters(r *http.Request) filterForm {
	return filterForm{
		Consumer: r.FormValue("consumer"), Reason: r.FormValue("reason"), Key: r.FormValue("key"),
		Older: r.FormValue("older"), Newer: r.FormValue("newer"), Handled: r.FormValue("handled") == "1",
	}
}

// query is the filters as a query string, for the paging links.
func (f filterForm) query(page int) string {
	v := url.Values{"consumer": {f.Consumer}}
	for k, s := range map[string]string{"reason": f.Reason, "key": f.Key, "older": f.Older, "newer": f.Newer} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if f.Handled {
		v.Set("handled", "1")
	}
	if page > 1 {
		v.Set("page", strconv.Itoa(page))
	}
	return v.Encode()
}

func (f filterForm) filter(cs *Consumer, now time.Time) (dlq.Filter, error) {
	older, err := parseDuration(f.Older)
	if err != nil {
		return dlq.Filter{}, fmt.Errorf("older than: %w", err)
	}
	newer, err := parseDuration(f.Newer)
	if err != nil {
		return dlq.Filter{}, fmt.Errorf("newer than: %w", err)
	}
	return dlq.Filter{Consumer: cs.Name, Topic: cs.Topic, Reason: f.Reason, Key: f.Key, OlderThan: older, NewerThan: newer, Now: now}, nil
}

// letterRow is a dead letter as the pages show it.
type letterRow struct {
	ID, Position, Age, Key, Class, ClassText, Reason, Handler string
	Handled                                                   bool
	Action, Why                                               string
	Replayed                                                  bool
	Payload                                                   string // preview of Size bytes
	Size                                                      int
}

func rowOf(l *dlq.Letter, now time.Time) letterRow {
	key, reason := l.Shown()
	return letterRow{
		ID: l.Msg.UUID, Position: l.Position, Age: l.ShownAge(now), Key: opfmt.OneLine(key, 200),
		Class: string(l.Class), ClassText: classText(l), Reason: opfmt.OneLine(reason, 300), Handler: l.Stamps.Handler,
		Handled: l.Handled, Action: string(l.Action), Why: l.Why, Replayed: l.Replayed,
		Payload: preview(l.Msg.Payload), Size: len(l.Msg.Payload),
	}
}

// letterRows are the rows of a preview or job up to a maximum, with the
// count of the rest and of the letters replayed (or that would be).
type letterRows struct {
	rows         []letterRow
	more, replay int64
}

func (r *letterRows) add(l *dlq.Letter, row letterRow, max int) {
	if l.Action == dlq.ActionReplay {
		r.replay++
	}
	if len(r.rows) < max {
		r.rows = append(r.rows, row)
	} else {
		r.more++
	}
}

type deadLettersData struct {
	Consumers        []string
	Filters          filterForm
	Kafka            bool
	Error            string
	Rows             []letterRow
	Page             int
	PrevURL, NextURL string
	Scanned, Total   int64
	Capped           bool
}

// deadLetters is GET /dead-letters: one page of a consumer's dead letters,
// read without consuming, classified against the claims.
func (c *Console) deadLetters(w http.ResponseWriter, r *http.Request) {
	f := readFilters(r)
	d := deadLettersData{Consumers: c.configured(), Filters: f, Page: 1}
	render := func(status int, err string) {
		d.Error = cmp.Or(err, d.Error)
		c.render(w, r, status, "deadletters", page{Title: "Dead letters", Nav: "dead-letters", Data: d})
	}
	if len(d.Consumers) == 0 {
		render(http.StatusOK, "Dead letters need a consumer's configuration: start the console with --consumer-config FILE.")
		return
	}
	if f.Consumer == "" {
		f.Consumer, d.Filters.Consumer = d.Consumers[0], d.Consumers[0]
	}
	if p, err := strconv.Atoi(r.FormValue("page")); err == nil && p > 1 {
		d.Page = p
	}
	cs := c.consumer(f.Consumer)
	if cs == nil {
		render(http.StatusNotFound, fmt.Sprintf("No configuration for consumer %q: dead letters are shown for the consumers given with --consumer-config.", f.Consumer))
		return
	}
	d.Kafka = cs.Broker.Kind == brokers.KindKafka
	now := time.Now()
	filter, err := f.filter(cs, now)
	if err != nil {
		render(http.StatusBadRequest, err.Error())
		return
	}
	src, err := c.openDestination(r.Context(), cs, d.Kafka && !f.Handled)
	if err != nil {
		render(http.StatusOK, err.Error())
		return
	}
	defer func() { _ = src.Close() }()
	capped := &cappedSource{Source: src, left: c.cfg.ScanCap}
	cls, err := c.classifier(r.Context(), cs)
	if err != nil {
		render(http.StatusOK, c.errText(err))
		return
	}
	from, to := (d.Page-1)*c.cfg.PageSize, d.Page*c.cfg.PageSize
	n := 0
	run := dlq.Run{
		Source: capped, Classifier: cls, Filter: filter, Topic: cs.Topic,
		// One more than the page: it says whether there is a next one.
		Limit: int64(to + 1),
		// Small batches: a page stops soon after its last letter.
		BatchSize: min(c.cfg.PageSize*2, 500),
		OnLetter: func(l *dlq.Letter) error {
			if n >= from && n < to {
				d.Rows = append(d.Rows, rowOf(l, now))
			}
			n++
			return nil
		},
	}
	tot, err := run.Browse(r.Context())
	if err != nil {
		d.Error = c.errText(fmt.Errorf("reading %s: %w", cs.PoisonTopic, err))
	}
	d.Scanned, d.Total = tot.Seen, src.Total()
	d.Capped = capped.hit && d.Scanned < d.Total
	if d.Page > 1 {
		d.PrevURL = "/dead-letters?" + f.query(d.Page-1)
	}
	if n > to {
		d.NextURL = "/dead-letters?" + f.query(d.Page+1)
	}
	render(http.StatusOK, "")
}

// openDestination opens cs's poison destination; resume: after the Kafka
// replay progress.
func (c *Console) openDestination(ctx context.Context, cs *Consumer, resume bool) (dlq.Source, error) {
	src, err := dlq.Open(ctx, cs.Broker, dlq.Options{Destination: cs.PoisonTopic, Consumer: cs.Name, Resume: resume})
	if err != nil {
		return nil, errors.New(c.errText(fmt.Errorf("opening %s: %w", cs.PoisonTopic, err)))
	}
	return src, nil
}

// classifier classifies with cs's key spec; nil without one.
func (c *Console) classifier(ctx context.Context, cs *Consumer) (*dlq.Classifier, error) {
	if cs.key == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
	defer cancel()
	memo, err := dlq.MemoOf(ctx, c.cfg.Pool, c.names)
	if err != nil {
		return nil, err
	}
	return &dlq.Classifier{Pool: c.cfg.Pool, Schema: c.cfg.Schema, Table: c.cfg.ClaimsTable, Consumer: cs.Name, Key: cs.key, Policy: cs.KeyPolicy, Memo: memo}, nil
}

// cappedSource stops a browse after left letters: one page never reads a
// whole large destination.
type cappedSource struct {
	dlq.Source
	left int
	hit  bool
}

func (s *cappedSource) Next(ctx context.Context, max int) ([]*dlq.Letter, error) {
	if s.left <= 0 {
		s.hit = true
		return nil, io.EOF
	}
	b, err := s.Source.Next(ctx, min(max, s.left))
	s.left -= len(b)
	return b, err
}

// selection is what a preview or replay works on: the selected letters
// (IDs), or All the filters match.
type selection struct {
	Filters        filterForm
	IDs            []string
	All            bool
	IncludeApplied bool
}

// sameAll says whether s and o are the same preview of all matching.
func (s selection) sameAll(o selection) bool {
	return s.All && o.All && s.Filters == o.Filters && s.IncludeApplied == o.IncludeApplied
}

func readSelection(r *http.Request) selection {
	return selection{Filters: readFilters(r), IDs: r.PostForm["id"], All: r.PostFormValue("scope") == "all", IncludeApplied: r.PostFormValue("include_applied") == "1"}
}

func (c *Console) selectionRun(ctx context.Context, sel selection, cs *Consumer, src dlq.Source) (*dlq.Run, error) {
	filter := dlq.Filter{Consumer: cs.Name, Topic: cs.Topic, IDs: sel.IDs, Now: time.Now()}
	var err error
	if sel.All {
		if filter, err = sel.Filters.filter(cs, filter.Now); err != nil {
			return nil, err
		}
	}
	cls, err := c.classifier(ctx, cs)
	if err != nil {
		return nil, errors.New(c.errText(err))
	}
	if cls == nil {
		return nil, fmt.Errorf("consumer %s has no key spec: dead letters cannot be classified, so none is replayed", cs.Name)
	}
	run := &dlq.Run{Source: src, Classifier: cls, Filter: filter, Topic: cs.Topic, IncludeApplied: sel.IncludeApplied, BatchSize: jobBatch}
	if !sel.All {
		run.Limit = int64(len(sel.IDs)) // stop once all were found
	}
	return run, nil
}

type previewData struct {
	Consumer  string
	Selection selection
	Rows      []letterRow
	More      int64
	Totals    dlq.Totals
	Replay    int64 // letters the replay would republish
	Error     string
	Kafka     bool
	Job       *jobView // the dry-run job of a preview of all matching
}

// preview is POST /dead-letters/preview: a dry run of the replay, allowed
// read-only. Selected letters are previewed within the request; all
// matching means reading the whole destination (25 s for 100,000 letters
// of a RabbitMQ queue), so that dry run is a job the request starts.
func (c *Console) preview(w http.ResponseWriter, r *http.Request) {
	sel := readSelection(r)
	d := previewData{Consumer: sel.Filters.Consumer, Selection: sel}
	render := func(status int, err string) {
		d.Error = cmp.Or(err, d.Error)
		c.render(w, r, status, "preview", page{Title: "Replay preview", Nav: "dead-letters", Data: d})
	}
	cs := c.consumer(sel.Filters.Consumer)
	switch {
	case cs == nil:
		render(http.StatusNotFound, fmt.Sprintf("No configuration for consumer %q.", sel.Filters.Consumer))
		return
	case !sel.All && len(sel.IDs) == 0:
		render(http.StatusBadRequest, "No letter selected: tick some, or preview all matching.")
		return
	}
	d.Kafka = cs.Broker.Kind == brokers.KindKafka
	if sel.All {
		// What the job would fail on at once is answered here.
		if _, err := sel.Filters.filter(cs, time.Now()); err != nil {
			render(http.StatusBadRequest, err.Error())
			return
		}
		if cs.key == nil {
			render(http.StatusBadRequest, fmt.Sprintf("consumer %s has no key spec: dead letters cannot be classified, so none is replayed", cs.Name))
			return
		}
		c.startJob(w, r, cs, sel, true)
		return
	}
	src, err := c.openDestination(r.Context(), cs, true)
	if err != nil {
		render(http.StatusOK, err.Error())
		return
	}
	defer func() { _ = src.Close() }()
	run, err := c.selectionRun(r.Context(), sel, cs, src)
	if err != nil {
		render(http.StatusBadRequest, err.Error())
		return
	}
	run.DryRun = true
	now := time.Now()
	var rows letterRows
	run.OnLetter = func(l *dlq.Letter) error {
		if l.Selected {
			rows.add(l, rowOf(l, now), maxPreviewRows)
		}
		return nil
	}
	d.Totals, err = run.Replay(r.Context())
	if err != nil {
		d.Error = c.errText(fmt.Errorf("dry run: %w", err))
	}
	d.Rows, d.More, d.Replay = rows.rows, rows.more, rows.replay
	render(http.StatusOK, "")
}
