package console

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
	"github.com/claimtx/claimtx/internal/pg"
)

// maxParkedRows bounds the keys and messages a page lists.
const maxParkedRows = 200

// parkedKeyRow is a parked order key as the pages show it.
type parkedKeyRow struct {
	Consumer, OrderKey, Age, Reason, Release string
	Messages                                 int64
	Failures                                 int
	URL                                      string
}

// parkedMsgRow is one parked message.
type parkedMsgRow struct {
	ID          int64
	Key, UUID   string
	Age, Reason string
	Payload     string
	Size        int
	Head        bool
}

type parkedData struct {
	Consumer string // the list's filter, "" for all
	Error    string
	Keys     []parkedKeyRow
	Key      *parkedKeyRow  // the key page's
	Msgs     []parkedMsgRow // its messages, in order
	Done     string         // the request just recorded
}

func keyRow(k pg.ParkedKey, now time.Time) parkedKeyRow {
	return parkedKeyRow{
		Consumer: k.Consumer, OrderKey: opfmt.OneLine(k.OrderKey, 200), Age: opfmt.Age(now.Sub(k.ParkedAt)),
		Reason: opfmt.OneLine(k.Reason, 300), Release: opfmt.Release(k, now), Messages: k.Messages, Failures: k.Failures,
		URL: "/parked/key?" + url.Values{"consumer": {k.Consumer}, "key": {k.OrderKey}}.Encode(),
	}
}

// parked is GET /parked: the parked order keys, oldest first, of every
// consumer or of ?consumer= (the overview's links).
func (c *Console) parked(w http.ResponseWriter, r *http.Request) {
	d := parkedData{Consumer: r.FormValue("consumer")}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	keys, err := pg.ParkingOf(c.store).Keys(ctx, d.Consumer, maxParkedRows)
	if err != nil {
		d.Error = "reading the parked keys: " + c.errText(err)
	}
	now := time.Now()
	for _, k := range keys {
		d.Keys = append(d.Keys, keyRow(k, now))
	}
	c.render(w, r, http.StatusOK, "parked", page{Title: "Parked", Nav: "parked", Data: d})
}

// parkedKey is GET /parked/key: one key's parked messages, head first,
// with Retry and Skip.
func (c *Console) parkedKey(w http.ResponseWriter, r *http.Request) {
	consumer, key := r.FormValue("consumer"), r.FormValue("key")
	if consumer == "" || key == "" {
		c.fail(w, r, http.StatusBadRequest, "a parked key's page needs its consumer and key")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	parking := pg.ParkingOf(c.store)
	d := parkedData{Done: r.FormValue("done")}
	k, ok, err := parking.Key(ctx, consumer, key)
	switch {
	case err != nil:
		c.fail(w, r, http.StatusInternalServerError, "reading the parked key: "+c.errText(err))
		return
	case !ok:
		d.Error = "Order key " + key + " of consumer " + consumer + " is not parked (any more)."
		c.render(w, r, http.StatusNotFound, "parked", page{Title: "Parked key", Nav: "parked", Data: d})
		return
	}
	now := time.Now()
	row := keyRow(k, now)
	row.OrderKey = k.OrderKey // the forms carry it whole
	d.Key = &row
	ms, err := parking.Messages(ctx, consumer, key, maxParkedRows)
	if err != nil {
		d.Error = "reading the parked messages: " + c.errText(err)
	}
	for i, m := range ms {
		d.Msgs = append(d.Msgs, parkedMsgRow{
			ID: m.ID, Key: opfmt.OneLine(m.Key, 200), UUID: opfmt.OneLine(m.UUID, 80), Age: opfmt.Age(now.Sub(m.ParkedAt)),
			Reason: opfmt.OneLine(m.Reason, 300), Payload: preview(m.Payload), Size: len(m.Payload), Head: i == 0,
		})
	}
	c.render(w, r, http.StatusOK, "parked", page{Title: "Parked key", Nav: "parked", Data: d})
}

// releaseParked is POST /parked/retry and /parked/skip: the request is
// recorded, and the consumer performs it (middleware.Park).
func (c *Console) releaseParked(w http.ResponseWriter, r *http.Request) {
	consumer, key := r.PostFormValue("consumer"), r.PostFormValue("key")
	skip := strings.HasSuffix(r.URL.Path, "/skip")
	note := strings.TrimSpace(r.PostFormValue("note"))
	switch {
	case consumer == "" || key == "":
		c.fail(w, r, http.StatusBadRequest, "a release needs the consumer and the order key")
		return
	case skip && note == "":
		c.fail(w, r, http.StatusBadRequest, "a skip needs a note: the poisoned head carries why it was skipped")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	ok, err := pg.ParkingOf(c.store).Request(ctx, consumer, key, skip, "console", note)
	switch {
	case err != nil:
		c.fail(w, r, http.StatusInternalServerError, "requesting the release: "+c.errText(err))
		return
	case !ok:
		c.fail(w, r, http.StatusNotFound, "order key "+key+" of consumer "+consumer+" is not parked")
		return
	}
	what := map[bool]string{true: "skip", false: "retry"}[skip]
	c.log.Info("console: release of a parked key requested", "consumer", consumer, "what", what)
	http.Redirect(w, r, "/parked/key?"+url.Values{"consumer": {consumer}, "key": {key}, "done": {what}}.Encode(), http.StatusSeeOther)
}
