package console

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/explain"
	"github.com/claimtx/claimtx/internal/pg"
)

type lookupData struct {
	Consumers []string // for the look-up form
	Pasteable []string // configured consumers with a key spec
	Consumer  string
	Key       string
	Report    *explain.Report
	Error     string
	Cleared   bool
	// Paste-a-message:
	Pasted      bool
	Payload     string
	Metadata    string
	PasteError  string
	DerivedFrom string // "derived with the key spec …"
}

func (c *Console) lookup(w http.ResponseWriter, r *http.Request) {
	d := c.lookupForm(r.Context(), r.FormValue("consumer"))
	d.Key = r.FormValue("key")
	d.Cleared = r.FormValue("cleared") == "1"
	if d.Consumer != "" && d.Key != "" {
		c.explain(r.Context(), &d)
	}
	c.render(w, r, http.StatusOK, "lookup", page{Title: "Look up a key", Nav: "lookup", Data: d})
}

// lookupForm fills the forms' choices.
func (c *Console) lookupForm(ctx context.Context, consumer string) lookupData {
	d := lookupData{Consumer: consumer}
	names, _, err := c.consumerNames(ctx)
	if err != nil {
		d.Error = "listing the consumers: " + c.errText(err)
	}
	if consumer != "" && !slices.Contains(names, consumer) {
		names = append(names, consumer)
	}
	d.Consumers = names
	for _, cs := range c.cfg.Consumers {
		if cs.Key != "" {
			d.Pasteable = append(d.Pasteable, cs.Name)
		}
	}
	return d
}

func (c *Console) explain(ctx context.Context, d *lookupData) {
	err := c.readOnly(ctx, func(tx pgx.Tx) error {
		rep, err := explain.Explain(ctx, tx, c.names, d.Consumer, d.Key)
		if err == nil {
			d.Report = &rep
		}
		return err
	})
	if err != nil {
		d.Error = c.errText(err)
	}
}

// paste is POST /lookup: look up the key the consumer derives for a
// pasted message.
func (c *Console) paste(w http.ResponseWriter, r *http.Request) {
	d := c.lookupForm(r.Context(), r.PostFormValue("consumer"))
	d.Pasted = true
	d.Payload, d.Metadata = r.PostFormValue("payload"), r.PostFormValue("metadata")
	status := http.StatusOK
	cs := c.consumer(d.Consumer)
	switch {
	case cs == nil || cs.key == nil:
		d.PasteError = fmt.Sprintf("consumer %q has no configuration with a key spec: start the console with its --consumer-config", d.Consumer)
		status = http.StatusBadRequest
	case len(d.Payload)+len(d.Metadata) > maxPaste:
		d.PasteError = fmt.Sprintf("the pasted message is %d bytes; at most 1 MiB (%d bytes) is accepted", len(d.Payload)+len(d.Metadata), maxPaste)
		d.Payload, d.Metadata = "", ""
		status = http.StatusRequestEntityTooLarge
	default:
		msg := message.NewMessage("", []byte(d.Payload))
		md, err := parseMetadata(d.Metadata)
		if err != nil {
			d.PasteError = err.Error()
			status = http.StatusBadRequest
			break
		}
		msg.Metadata = md
		key, err := dlq.DeriveKey(cs.key, cs.KeyPolicy, msg)
		if err != nil {
			d.PasteError = fmt.Sprintf("no key with the key spec %s: %v", cs.Key, err)
			break
		}
		d.Key, d.DerivedFrom = key, cs.Key
		c.explain(r.Context(), &d)
	}
	c.render(w, r, status, "lookup", page{Title: "Look up a key", Nav: "lookup", Data: d})
}

// parseMetadata reads one "name: value" per line.
func parseMetadata(s string) (message.Metadata, error) {
	md := message.Metadata{}
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(nil, maxPaste)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("metadata line %d: want \"name: value\"", n)
		}
		md.Set(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	return md, sc.Err()
}

// clearMemo is POST /poison-memo/clear: the message's next copy runs the
// handler again.
func (c *Console) clearMemo(w http.ResponseWriter, r *http.Request) {
	consumer, key := r.PostFormValue("consumer"), r.PostFormValue("key")
	if consumer == "" || key == "" {
		c.fail(w, r, http.StatusBadRequest, "clearing a poison memo needs its consumer and key")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	if _, err := pg.MemosOf(c.cfg.Pool, c.names).Clear(ctx, pg.MemoFilter{Consumer: consumer, Keys: []string{key}}); err != nil {
		c.fail(w, r, http.StatusInternalServerError, "clearing the poison memo: "+c.errText(err))
		return
	}
	c.log.Info("console: poison memo cleared", "consumer", consumer, "key", key)
	http.Redirect(w, r, "/lookup?"+url.Values{"consumer": {consumer}, "key": {key}, "cleared": {"1"}}.Encode(), http.StatusSeeOther)
}
