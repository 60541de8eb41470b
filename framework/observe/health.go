package observe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/claimtx/claimtx/internal/migrate"
	"github.com/claimtx/claimtx/store"
)

// Health is a readiness check: the database answers, claimtx's migrations
// are current, and the broker is connected. It is an http.Handler that
// answers 200 with a JSON report when ready and 503 otherwise.
type Health struct {
	// Store is checked for reachability and migration version. Required.
	Store *store.Store
	// Broker reports whether the broker connection is up; nil skips the
	// check. See SubscriberConnected and DialCheck.
	Broker func(context.Context) error
	// Timeout bounds each check. Defaults to 2s.
	Timeout time.Duration
}

// Report is the outcome of a readiness check.
type Report struct {
	Ready  bool              `json:"ready"`
	Checks map[string]string `json:"checks"`
}

// Check runs every check concurrently.
func (h Health) Check(ctx context.Context) Report {
	timeout := h.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := fn(ctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				rep.Ready = false
				rep.Checks[name] = err.Error()
			} else {
				rep.Checks[name] = "ok"
			}
		}()
	}
	wg.Wait()
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
	if want := migrate.Latest(); v != want {
		return fmt.Errorf("schema at migration %d, this build needs %d", v, want)
	}
	return nil
}

// ServeHTTP answers 200 when ready, 503 otherwise, with the Report as
// JSON. Error texts come from pgx and the broker clients, which redact
// credentials.
func (h Health) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rep := h.Check(r.Context())
	w.Header().Set("Content-Type", "application/json")
	if !rep.Ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(rep)
}

// ConnectionReporter is the optional interface a subscriber implements to
// take part in readiness: IsConnected reports whether its broker connection
// is up right now. It must be safe to call concurrently with the
// subscriber's own work and answer quickly (well inside Health.Timeout),
// since /healthz calls it on every request.
//
// claimtx's RabbitMQ and Kafka subscribers implement it (brokers/amqp,
// brokers/kafka), as does watermill-amqp's subscriber. A user-registered
// adapter implements it too to be checked; one that does not is not.
type ConnectionReporter interface {
	IsConnected() bool
}

// SubscriberConnected returns the readiness check of a subscriber that
// implements ConnectionReporter, found by type assertion. For any other
// subscriber it returns nil (no broker check): use DialCheck, or a check of
// your own, instead.
func SubscriberConnected(sub any) func(context.Context) error {
	c, ok := sub.(ConnectionReporter)
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

// DialCheck reports ready when at least one of addrs accepts a TCP
// connection: a coarse check for brokers whose subscribers do not implement
// ConnectionReporter. It cannot tell a broker that would reject the
// subscriber's credentials from a healthy one.
func DialCheck(addrs ...string) func(context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		var errs []error
		for _, a := range addrs {
			c, err := d.DialContext(ctx, "tcp", a)
			if err == nil {
				_ = c.Close()
				return nil
			}
			errs = append(errs, err)
		}
		return fmt.Errorf("no broker reachable: %w", errors.Join(errs...))
	}
}
