// Package console is the web console of `claimtx console` over one claim
// table (docs/console.md): html/template pages without JavaScript (the
// chart is SVG drawn in Go, a running replay refreshes with a meta
// refresh); security.go keeps it safe to run.
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
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/time/rate"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework"
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
	MinTokenBytes       = 16      // the shortest access token accepted
	maxConsumers        = 200     // listed from the claim table
	maxJobs             = 20      // finished replay jobs kept in memory
	maxPaste            = 1 << 20 // a pasted message, payload and metadata
)

// Consumer is a consumer's configuration (consumer.LoadConfig), which
// dead letters and paste-a-message need.
type Consumer struct {
	Name               string
	Topic, PoisonTopic string // PoisonTopic defaults to Topic + ".poison"
	Key                string // the key spec
	KeyPolicy          framework.KeyPolicy
	Retention          time.Duration // 0: not configured
	Broker             brokers.Config

	key framework.KeyFunc
}

// Config configures New.
type Config struct {
	Pool *pgxpool.Pool // required
	// Schema, ClaimsTable and OutboxTable default to claimtx's defaults.
	Schema, ClaimsTable, OutboxTable string
	// Consumers have dead letters and paste-a-message; others found in the
	// claim table get the overview and key look-up.
	Consumers []Consumer
	Metrics   map[string]string // consumer name -> Prometheus endpoint
	// Token (at least MinTokenBytes) is required to use the console when
	// set; without it only a loopback Host or Listen is answered.
	Token        string
	Listen       string
	ReadOnly     bool          // no replay, no clearing of poison memos, no release of parked keys
	Secrets      []string      // redacted from every page
	QueryTimeout time.Duration // each query of a page; default 5 s
	PageSize     int           // dead letters per page; default 50
	ScanCap      int           // dead letters read for one page; default 5000
	ReplayRate   float64       // > 0: letters replayed per second at most
	Logger       *slog.Logger  // default slog.Default()
	Extractors   *framework.Registry
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

	key      []byte        // signs sessions and CSRF tokens; random per process
	limiter  *rate.Limiter // 5 failed sign-ins a second, however many connections try
	horizons sync.Map      // consumer -> horizonResult
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
		jobs: &jobs{byID: map[string]*job{}, running: map[string]string{}},
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

// Close cancels the running replay jobs and waits for them to stop
// (between batches: nothing is lost).
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
	mux.HandleFunc("GET /parked", c.parked)
	mux.HandleFunc("GET /parked/key", c.parkedKey)
	mux.HandleFunc("POST /parked/retry", c.releaseParked)
	mux.HandleFunc("POST /parked/skip", c.releaseParked)
	return mux
}

// page is what every template gets.
type page struct {
	Title    string
	Nav      string // the nav entry to mark current
	ReadOnly bool
	Auth     bool // a token is configured: show "Sign out"
	CSRF     string
	Refresh  bool // meta refresh every second (a running job)
	Data     any
}

func (c *Console) parseTemplates() error {
	layout, err := template.New("layout.html").Funcs(template.FuncMap{"ts": timestamp}).ParseFS(templateFS, "templates/layout.html")
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

// connString matches connection strings: the console shows none at all,
// password redacted or not (host names and users are an attacker's map).
var connString = regexp.MustCompile(`(?i)\b(amqps?|postgres(?:ql)?|kafka|nats)://[^\s"']+`)

func (c *Console) redact(s string) string {
	return connString.ReplaceAllString(config.Scrub(s, c.cfg.Secrets...), "[$1 URL]")
}

func (c *Console) errText(err error) string {
	if err == nil {
		return ""
	}
	return c.redact(err.Error())
}

func (c *Console) consumer(name string) *Consumer { return c.consumers[name] }

// configured lists the configured consumers' names.
func (c *Console) configured() []string {
	var names []string
	for _, cs := range c.cfg.Consumers {
		names = append(names, cs.Name)
	}
	return names
}

var errTimedOut = errors.New("slow: timed out")
