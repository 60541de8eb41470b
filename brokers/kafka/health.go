package kafka

import (
	"time"

	"github.com/IBM/sarama"
)

// The probe answers inside observe.Health's 2s budget, and a /healthz
// scraped every second does not open a connection per request.
const (
	probeTimeout = time.Second
	probeTTL     = 2 * time.Second
)

// IsConnected reports whether one of the Brokers answered an ApiVersions
// request within a second, with the subscriber's TLS and SASL (a TCP dial
// would call a broker that refuses our credentials healthy); false after
// Close. The answer is cached for two seconds. observe.SubscriberConnected
// uses it for readiness.
func (s *subscriber) IsConnected() bool {
	if s.closed() {
		return false
	}
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if !s.connAt.IsZero() && time.Since(s.connAt) < probeTTL {
		return s.connOK
	}
	s.connOK, s.connAt = probeAny(s.sc, s.cfg.Brokers), time.Now()
	return s.connOK
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
	// The steps' timeouts add up: bound the whole answer.
	deadline := time.After(probeTimeout)
	for range addrs {
		select {
		case ok := <-answers:
			if ok {
				return true
			}
		case <-deadline:
			return false
		}
	}
	return false
}
