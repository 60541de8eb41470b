// Package keycheck verifies a key spec against a sample of messages for
// `claimtx keys check`: collisions (different payloads, one key: the later
// are lost as duplicates), volatile keys (one payload, several keys: every
// redelivery applies again), unkeyable messages, key lengths and the
// event-time spread.
package keycheck

import (
	"cmp"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/dlq"
)

// Checker accumulates messages: Add them, then Report.
type Checker struct {
	Key       framework.KeyFunc
	EventTime framework.TimeFunc // optional
	Policy    framework.KeyPolicy
	Examples  int // message ids kept per finding; default 5

	seen       int
	byKey      map[string]*keyStat
	byPayload  map[string]map[string]bool // fingerprint -> keys
	payloadIDs map[string][]string        // fingerprint -> message ids
	unkeyable  map[string][]string        // reason -> ids (capped)
	unkeyableN map[string]int             // reason -> messages
	lengths    []int
	timed      int
	untimed    map[string]int // reason -> count
	earliest   time.Time
	latest     time.Time
}

type keyStat struct {
	n      int
	prints map[string][]string // fingerprint -> ids
}

func (c *Checker) examples() int {
	if c.Examples > 0 {
		return c.Examples
	}
	return 5
}

func (c *Checker) init() {
	if c.byKey == nil {
		c.byKey = map[string]*keyStat{}
		c.byPayload = map[string]map[string]bool{}
		c.payloadIDs = map[string][]string{}
		c.unkeyable = map[string][]string{}
		c.unkeyableN = map[string]int{}
		c.untimed = map[string]int{}
	}
}

func (c *Checker) eventTime(msg *message.Message) (t time.Time, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the time function panicked: %v", r)
		}
	}()
	return c.EventTime(msg)
}

// example adds id to the examples of k in m, up to Examples.
func (c *Checker) example(m map[string][]string, k, id string) {
	if ids := m[k]; len(ids) < c.examples() {
		m[k] = append(ids, id)
	}
}

// Add takes one message of the sample into account.
func (c *Checker) Add(msg *message.Message) {
	c.init()
	c.seen++
	fp := hex.EncodeToString(dlq.Fingerprint(msg.Payload))
	key, err := dlq.DeriveKey(c.Key, c.Policy, msg)
	if err != nil {
		c.example(c.unkeyable, err.Error(), msg.UUID)
		c.unkeyableN[err.Error()]++
	} else {
		c.lengths = append(c.lengths, len(key))
		ks := c.byKey[key]
		if ks == nil {
			ks = &keyStat{prints: map[string][]string{}}
			c.byKey[key] = ks
		}
		ks.n++
		c.example(ks.prints, fp, msg.UUID)
		if c.byPayload[fp] == nil {
			c.byPayload[fp] = map[string]bool{}
		}
		c.byPayload[fp][key] = true
		c.example(c.payloadIDs, fp, msg.UUID)
	}
	if c.EventTime == nil {
		return
	}
	at, err := c.eventTime(msg)
	if err != nil {
		c.untimed[err.Error()]++
		return
	}
	c.timed++
	if c.earliest.IsZero() || at.Before(c.earliest) {
		c.earliest = at
	}
	if at.After(c.latest) {
		c.latest = at
	}
}

// Collision is a key that several different payloads share.
type Collision struct {
	Key      string              `json:"key"`
	Messages int                 `json:"messages"`
	Payloads map[string][]string `json:"payloads"` // fingerprint -> example ids
}

// Volatile is a payload that arrived under several keys.
type Volatile struct {
	Fingerprint string   `json:"fingerprint"`
	Keys        []string `json:"keys"`
	IDs         []string `json:"ids"`
}

// Unkeyable is why some messages cannot be keyed.
type Unkeyable struct {
	Reason   string   `json:"reason"`
	Messages int      `json:"messages"`
	IDs      []string `json:"ids"`
}

// Report is the outcome of a check.
type Report struct {
	Messages   int         `json:"messages"`
	Keyed      int         `json:"keyed"`
	Keys       int         `json:"distinct_keys"`
	Duplicates int         `json:"duplicates"` // same key, same payload: redeliveries, harmless
	Collisions []Collision `json:"collisions"`
	Volatile   []Volatile  `json:"volatile_keys"`
	Unkeyable  []Unkeyable `json:"unkeyable"`
	KeyLength  *Quantiles  `json:"key_length_bytes,omitempty"`
	EventTime  *TimeSpread `json:"event_time,omitempty"`
}

// Quantiles of key lengths in bytes.
type Quantiles struct {
	Min, P50, P90, P99, Max int
}

// TimeSpread is how far apart the sample's event times are.
type TimeSpread struct {
	With     int            `json:"with"`
	Without  map[string]int `json:"without,omitempty"` // reason -> messages
	Earliest time.Time      `json:"earliest,omitzero"`
	Latest   time.Time      `json:"latest,omitzero"`
	Spread   string         `json:"spread,omitempty"`
}

// Report returns what the messages so far show, most frequent first.
func (c *Checker) Report() Report {
	c.init()
	r := Report{Messages: c.seen, Keyed: len(c.lengths), Keys: len(c.byKey)}
	for key, ks := range c.byKey {
		r.Duplicates += ks.n - len(ks.prints)
		if len(ks.prints) > 1 {
			r.Collisions = append(r.Collisions, Collision{Key: key, Messages: ks.n, Payloads: ks.prints})
		}
	}
	slices.SortFunc(r.Collisions, func(a, b Collision) int {
		return cmp.Or(cmp.Compare(b.Messages, a.Messages), strings.Compare(a.Key, b.Key))
	})
	for fp, keys := range c.byPayload {
		if len(keys) < 2 {
			continue
		}
		v := Volatile{Fingerprint: fp, IDs: c.payloadIDs[fp], Keys: slices.Sorted(maps.Keys(keys))}
		if len(v.Keys) > c.examples() {
			v.Keys = v.Keys[:c.examples()]
		}
		r.Volatile = append(r.Volatile, v)
	}
	slices.SortFunc(r.Volatile, func(a, b Volatile) int {
		return cmp.Or(cmp.Compare(len(c.byPayload[b.Fingerprint]), len(c.byPayload[a.Fingerprint])), strings.Compare(a.Fingerprint, b.Fingerprint))
	})
	for reason, ids := range c.unkeyable {
		r.Unkeyable = append(r.Unkeyable, Unkeyable{Reason: reason, Messages: c.unkeyableN[reason], IDs: ids})
	}
	slices.SortFunc(r.Unkeyable, func(a, b Unkeyable) int {
		return cmp.Or(cmp.Compare(b.Messages, a.Messages), strings.Compare(a.Reason, b.Reason))
	})
	if n := len(c.lengths); n > 0 {
		l := slices.Sorted(slices.Values(c.lengths))
		q := func(p float64) int { return l[min(n-1, int(p*float64(n)))] }
		r.KeyLength = &Quantiles{Min: l[0], P50: q(0.5), P90: q(0.9), P99: q(0.99), Max: l[n-1]}
	}
	if c.EventTime != nil {
		ts := &TimeSpread{With: c.timed, Without: c.untimed} // omitempty drops an empty map
		if c.timed > 0 {
			ts.Earliest, ts.Latest = c.earliest.UTC(), c.latest.UTC()
			ts.Spread = c.latest.Sub(c.earliest).String()
		}
		r.EventTime = ts
	}
	return r
}
