package kafka

import (
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// Readiness probe timings. The probe must answer inside observe.Health's
// default 2s budget, and a /healthz scraped every second must not open a
// Kafka connection per request.
const (
	probeTimeout = time.Second
	probeTTL     = 2 * time.Second
)

// connState caches the last probe's answer.
type connState struct {
	mu sync.Mutex // held during a probe, so concurrent callers share it
	at time.Time
	ok bool
}

// IsConnected reports whether Kafka is reachable for this subscriber: one of
// brokers.KafkaConfig.Brokers accepted a connection, with the subscriber's own TLS and
// SASL settings, and answered an ApiVersions request within a second. It is
// false after Close. observe.SubscriberConnected uses it for readiness.
//
// Why a probe: watermill-kafka keeps its Sarama client and consumer group to
// itself, so their connection state cannot be read; and a plain TCP dial
// would call a broker that rejects our credentials healthy. The answer is
// cached for two seconds, so readiness costs one short-lived connection per
// seed broker every two seconds whatever the scrape rate, and a change is
// seen within about three seconds.
func (s *Subscriber) IsConnected() bool {
	if s.closed() {
		return false
	}
	s.conn.mu.Lock()
	defer s.conn.mu.Unlock()
	if !s.conn.at.IsZero() && time.Since(s.conn.at) < probeTTL {
		return s.conn.ok
	}
	s.conn.ok = probeAny(s.sc, s.cfg.Brokers)
	s.conn.at = time.Now()
	return s.conn.ok
}

// probeAny asks every broker of addrs at once and reports whether one
// answered within probeTimeout.
func probeAny(sc *sarama.Config, addrs []string) bool {
	answers := make(chan bool, len(addrs)) // buffered: late attempts never block
	for _, addr := range addrs {
		go func() {
			answers <- probeBroker(addr, sc, sc.Net.SASL.Enable, probeTimeout) == nil
		}()
	}
	// Each step above has its own timeout, but dial, TLS, SASL and the
	// request add up: bound the whole answer, so /healthz answers inside
	// its budget. Attempts still running finish on their own timeouts.
	deadline := time.NewTimer(probeTimeout)
	defer deadline.Stop()
	for range addrs {
		select {
		case ok := <-answers:
			if ok {
				return true
			}
		case <-deadline.C:
			return false
		}
	}
	return false
}
