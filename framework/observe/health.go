package observe

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/store"
)

// Health is a readiness check of the database, claimtx's migrations and the
// broker connection; as an http.Handler it answers 200 or 503 with a Report.
type Health struct {
	// Store is checked for reachability and migration version. Required.
	Store *store.Store
	// Broker reports whether the broker connection is up (see
	// SubscriberConnected); nil skips the check.
	Broker func(context.Context) error
	// Timeout bounds each check. Defaults to 2s.
	Timeout time.Duration
	// Warnings, when set, returns findings that need an operator but do
	// not make the consumer unready, reported in Checks as "warning: ...".
	Warnings func() map[string]string
}

// Report is the outcome of a readiness check.
type Report struct {
	Ready  bool              `json:"ready"`
	Checks map[string]string `json:"checks"`
}

// Check runs every check concurrently.
func (h Health) Check(ctx context.Context) Report {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(max(h.Timeout, 0), 2*time.Second))
	defer cancel()
	checks := map[string]func(context.Context) error{
		"database":   h.database,
		"migrations": h.migrations,
	}
	if h.Broker != nil {
		checks["broker"] = h.Broker
	}
	rep := Report{Ready: true, Checks: make(map[string]string, len(checks))}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, fn := range checks {
		wg.Go(func() {
			err := fn(ctx)
			mu.Lock()
			defer mu.Unlock()
			rep.Checks[name] = "ok"
			if err != nil {
				rep.Ready, rep.Checks[name] = false, err.Error()
			}
		})
	}
	wg.Wait()
	if h.Warnings != nil {
		for name, w := range h.Warnings() {
			rep.Checks[name] = "warning: " + w
		}
	}
	return rep
}

func (h Health) database(ctx context.Context) error {
	if h.Store == nil {
		return errors.New("no store configured")
	}
	return h.Store.Pool().Ping(ctx)
}

func (h Health) migrations(ctx context.Context) error {
	if h.Store == nil {
		return errors.New("no store configured")
	}
	v, err := h.Store.Version(ctx)
	if err != nil {
		return err
	}
	if want := store.SchemaVersion; v != want {
		return fmt.Errorf("schema at migration %d, this build needs %d", v, want)
	}
	return nil
}

// ServeHTTP answers 200 when ready, 503 otherwise, with the Report as JSON
// (error texts are pgx's and the brokers', which redact credentials).
func (h Health) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rep := h.Check(r.Context())
	w.Header().Set("Content-Type", "application/json")
	if !rep.Ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(rep)
}

// SubscriberConnected returns the readiness check of a subscriber with an
// IsConnected() bool method (called on every request); nil for others.
func SubscriberConnected(sub message.Subscriber) func(context.Context) error {
	c, ok := sub.(interface{ IsConnected() bool })
	if !ok {
		return nil
	}
	return func(context.Context) error {
		if !c.IsConnected() {
			return errors.New("broker connection is down")
		}
		return nil
	}
}
