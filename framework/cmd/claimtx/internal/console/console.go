// Package console is the web console of `claimtx console`: a small
// server-rendered site over the operator tooling (framework/cmd/claimtx/internal/explain,
// framework/cmd/claimtx/internal/dlq, internal/poison, framework/internal/replay) for one claim table.
//
// Pages are html/template with an embedded stylesheet and no JavaScript:
// the chart is SVG drawn in Go, a running replay refreshes its page with a
// meta refresh. security.go holds what keeps the console safe to run:
// token sessions or a loopback-only Host check, CSRF on every POST,
// read-only mode and the response headers.
package console

import (
	"cmp"
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/time/rate"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
	"github.com/claimtx/claimtx/internal/config"
	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/store"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets/*
var assetFS embed.FS

// Defaults of Config.
const (
	DefaultQueryTimeout = 5 * time.Second
	DefaultPageSize     = 50
	DefaultScanCap      = 5000
	// MinTokenBytes is the shortest access token accepted.
	MinTokenBytes = 16
	// maxConsumers bounds the consumers listed from the claim table.
	maxConsumers = 200
	// maxJobs is how many finished replay jobs are kept in memory.
	maxJobs = 20
	// maxPaste bounds a pasted message (payload and metadata).
	maxPaste = 1 << 20
)

// Consumer is a consumer the console knows the configuration of
// (consumer.LoadConfig): what dead letters and paste-a-message need.
type Consumer struct {
	Name string
	// Topic is what the consumer consumes; PoisonTopic its poison
	// destination. Defaults to Topic + ".poison".
	Topic, PoisonTopic string
	// Key is the key spec; KeyPolicy the claim's key policy.
	Key       string
	KeyPolicy framework.KeyPolicy
	// Retention is the claims' retention (0: not configured).
	Retention time.Duration
	// Broker reaches Topic and PoisonTopic.
	Broker brokers.Config

	key framework.KeyFunc
}

// Config configures New.
type Config struct {
	// Pool reaches the claim table. Required.
	Pool *pgxpool.Pool
	// Schema, ClaimsTable and OutboxTable name claimtx's tables. Default to
	// claimtx, processed_messages and outbox.
	Schema, ClaimsTable, OutboxTable string
	// Consumers are the consumers with a configuration. Others found in
	// the claim table get the overview and key look-up only.
	Consumers []Consumer
	// Metrics maps a consumer name to its Prometheus endpoint, read for
	// the duplicate and poisoned totals. Defaults to none.
	Metrics map[string]string
	// Token, when set, is required to use the console (a login sets a
	// session cookie; scripts send "Authorization: Bearer TOKEN"). It must
	// be at least MinTokenBytes long. Without it the console only answers
	// requests whose Host is a loopback name or Listen, so a web page
	// cannot reach it through DNS rebinding.
	Token string
	// Listen is the address the server listens on, accepted as a Host
	// besides the loopback names. Defaults to "".
	Listen string
	// ReadOnly removes every state-changing action (replay, clearing a
	// poison memo). Defaults to false.
	ReadOnly bool
	// Secrets are strings never to show in a page (passwords of the
	// database and brokers): errors are redacted with them.
	Secrets []string
	// QueryTimeout bounds each query of a page. Defaults to 5 s.
	QueryTimeout time.Duration
	// PageSize is the number of dead letters per page. Defaults to 50.
	PageSize int
	// ScanCap bounds the dead letters read for one page. Defaults to 5000.
	ScanCap int
	// ReplayRate, when > 0, bounds a replay to this many letters per
	// second, so a consumer is not flooded. Defaults to 0: no bound.
	ReplayRate float64
	// Logger receives errors and replay jobs. Defaults to slog.Default().
	Logger *slog.Logger
	// Extractors resolves the consumers' key specs. Defaults to the
	// built-in extractors only.
	Extractors *framework.Registry
}

// Console serves the console's pages. Close it to cancel running replay
// jobs.
type Console struct {
	cfg       Config
	names     *pg.Names
	store     *store.Store
	consumers map[string]*Consumer
	handler   http.Handler
	pages     map[string]*template.Template
	log       *slog.Logger

	key []byte // signs sessions and CSRF tokens; random per process
	// limiter allows 5 failed sign-ins a second per process, so a token
	// cannot be guessed fast however many connections try.
	limiter  *rate.Limiter
	horizons *horizonCache
	jobs     *jobs

	ctx    context.Context // ends on Close: replay jobs run under it
	cancel context.CancelFunc
}

// New validates cfg and returns the console.
func New(cfg Config) (*Console, error) {
	if cfg.Pool == nil {
		return nil, &framework.ConfigError{Field: "Pool", Reason: "is required"}
	}
	if cfg.Token != "" && len(cfg.Token) < MinTokenBytes {
		return nil, &framework.ConfigError{Field: "Token", Reason: fmt.Sprintf("is %d bytes; use at least %d random bytes", len(cfg.Token), MinTokenBytes)}
	}
	cfg.Schema = cmp.Or(cfg.Schema, pg.DefaultSchema)
	cfg.ClaimsTable = cmp.Or(cfg.ClaimsTable, pg.DefaultClaimsTable)
	cfg.OutboxTable = cmp.Or(cfg.OutboxTable, pg.DefaultOutboxTable)
	cfg.QueryTimeout = cmp.Or(cfg.QueryTimeout, DefaultQueryTimeout)
	cfg.PageSize = cmp.Or(cfg.PageSize, DefaultPageSize)
	cfg.ScanCap = cmp.Or(cfg.ScanCap, DefaultScanCap)
	if cfg.Extractors == nil {
		cfg.Extractors = framework.NewRegistry()
	}
	st, err := store.New(cfg.Pool, store.Config{Schema: cfg.Schema, ClaimsTable: cfg.ClaimsTable, OutboxTable: cfg.OutboxTable})
	if err != nil {
		return nil, err
	}
	c := &Console{
		cfg: cfg, store: st, names: pg.NewNames(cfg.Schema, cfg.ClaimsTable, cfg.OutboxTable),
		consumers: map[string]*Consumer{}, log: cmp.Or(cfg.Logger, slog.Default()),
		key: make([]byte, 32), limiter: rate.NewLimiter(5, 5),
		horizons: &horizonCache{ttl: time.Minute, m: map[string]horizonResult{}},
		jobs:     &jobs{byID: map[string]*job{}, running: map[string]string{}},
	}
	_, _ = rand.Read(c.key) // crypto/rand.Read never fails (Go ≥ 1.24)
	for i := range cfg.Consumers {
		cs := cfg.Consumers[i]
		field := fmt.Sprintf("Consumers[%d]", i)
		if err := config.ValidateConsumer(field+".Name", cs.Name); err != nil {
			return nil, err
		}
		if _, dup := c.consumers[cs.Name]; dup {
			return nil, &framework.ConfigError{Field: field + ".Name", Reason: fmt.Sprintf("consumer %q configured twice", cs.Name)}
		}
		if cs.Topic == "" {
			return nil, &framework.ConfigError{Field: field + ".Topic", Reason: "is required"}
		}
		cs.PoisonTopic = cmp.Or(cs.PoisonTopic, cs.Topic+".poison")
		if cs.Key != "" {
			kf, err := cfg.Extractors.ParseKey(cs.Key)
			if err != nil {
				// The spec's own error, its field named once: "Consumers[0].Key".
				return nil, config.Rename(err, func(string) (string, bool) { return field + ".Key", true })
			}
			cs.key = kf
		}
		c.consumers[cs.Name] = &cs
	}
	if err := c.parseTemplates(); err != nil {
		return nil, err
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.handler = c.secure(c.routes())
	return c, nil
}

// ServeHTTP serves the console.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.handler.ServeHTTP(w, r) }

// Close cancels the running replay jobs and waits for them to stop: a
// replay interrupted between batches leaves every letter in the
// destination, republished, or both (framework/cmd/claimtx/internal/dlq).
func (c *Console) Close() {
	c.cancel()
	c.jobs.wg.Wait()
}

func (c *Console) routes() *http.ServeMux {
	mux := http.NewServeMux()
	assets, _ := fs.Sub(assetFS, "assets")
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(assets)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok"))
	})
	mux.HandleFunc("GET /login", c.loginPage)
	mux.HandleFunc("POST /login", c.login)
	mux.HandleFunc("POST /logout", c.logout)
	mux.HandleFunc("GET /{$}", c.overview)
	mux.HandleFunc("GET /lookup", c.lookup)
	mux.HandleFunc("POST /lookup", c.paste)
	mux.HandleFunc("POST /poison-memo/clear", c.clearMemo)
	mux.HandleFunc("GET /dead-letters", c.deadLetters)
	mux.HandleFunc("POST /dead-letters/preview", c.preview)
	mux.HandleFunc("POST /dead-letters/replay", c.replay)
	mux.HandleFunc("GET /jobs/{id}", c.jobPage)
	return mux
}

// page is what every template gets.
type page struct {
	Title    string
	Nav      string // the nav entry to mark current
	ReadOnly bool
	Auth     bool // a token is configured: show "Sign out"
	CSRF     string
	Refresh  bool // meta refresh every second (a running replay)
	Data     any
}

func (c *Console) parseTemplates() error {
	funcs := template.FuncMap{
		"dur":      opfmt.Age,
		"ts":       timestamp,
		"fmtDur":   opfmt.FormatDuration,
		"join":     strings.Join,
		"classTxt": classText,
	}
	layout, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return err
	}
	entries, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return err
	}
	c.pages = map[string]*template.Template{}
	for _, e := range entries {
		name := strings.TrimSuffix(strings.TrimPrefix(e, "templates/"), ".html")
		if name == "layout" {
			continue
		}
		t, err := template.Must(layout.Clone()).ParseFS(templateFS, e)
		if err != nil {
			return err
		}
		c.pages[name] = t
	}
	return nil
}

// render writes a page with status.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	t, ok := c.pages[name]
	if !ok {
		http.Error(w, "no template "+name, http.StatusInternalServerError)
		return
	}
	p.ReadOnly = c.cfg.ReadOnly
	id, _ := r.Context().Value(ctxKey{}).(identity)
	p.Auth = c.cfg.Token != "" && id.session != "" && id.session != anonymous
	p.CSRF = c.csrfToken(r)
	var buf strings.Builder
	if err := t.ExecuteTemplate(&buf, "layout", p); err != nil {
		c.log.Error("console: render", "page", name, "err", err)
		http.Error(w, "rendering failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(buf.String()))
}

// fail renders an error page whose message is redacted.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, status, "error", page{Title: http.StatusText(status), Data: c.redact(msg)})
}

// connString matches connection strings in error texts: the libraries
// redact their passwords, but the console shows no connection string at
// all (host names and users are an attacker's map).
var connString = regexp.MustCompile(`(?i)\b(amqps?|postgres(?:ql)?|kafka|nats)://[^\s"']+`)

// redact removes every configured secret, and every connection string,
// from s.
func (c *Console) redact(s string) string {
	for _, p := range c.cfg.Secrets {
		if p != "" {
			s = strings.ReplaceAll(s, p, "xxxxx")
		}
	}
	return connString.ReplaceAllString(s, "[$1 URL]")
}

// errText is err's text, redacted, for a page.
func (c *Console) errText(err error) string {
	if err == nil {
		return ""
	}
	return c.redact(err.Error())
}

// consumer returns the configured consumer name, or nil.
func (c *Console) consumer(name string) *Consumer { return c.consumers[name] }

// configured lists the configured consumers' names, sorted.
func (c *Console) configured() []string {
	var names []string
	for _, cs := range c.cfg.Consumers {
		names = append(names, cs.Name)
	}
	return names
}

var errTimedOut = errors.New("slow: timed out")
