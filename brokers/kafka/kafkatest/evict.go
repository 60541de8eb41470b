package kafkatest

import (
	"cmp"
	"context"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/claimtx/claimtx/internal/pg"
)

// eviction describes one member the broker removed from its group.
type eviction struct {
	Group          string
	MemberID       string
	InstanceID     *string // nil for dynamic members
	ClientID       string
	ClientHost     string
	State          string        // the group's state when the member was evicted
	Silent         time.Duration // how long the member had sent nothing
	SessionTimeout time.Duration // the session timeout it was held to
}

// fallbackSessionTimeout is for a member whose join we never saw with its ID
// in a group whose joins we never saw (a restart from the data directory).
const fallbackSessionTimeout = 45 * time.Second

// evictor is the package documentation's "Silent members".
type evictor struct {
	cluster *kfake.Cluster
	client  *kgo.Client
	opts    Options

	mu     sync.Mutex
	groups map[string]*groupTrack
}

type groupTrack struct {
	classic    bool // we saw a classic JoinGroup for it
	nextGen    bool // a KIP-848 group: kfake runs its session timers; we keep out
	maxSession time.Duration
	lastJoin   time.Time
	members    map[string]*memberTrack
	lastState  string
	lastEpoch  int32
	seenPoll   bool
}

type memberTrack struct {
	lastSeen time.Time
	session  time.Duration
	listed   bool // listed by kfake (a join is recorded before kfake handles it)
	joining  bool // its latest request is an unanswered JoinGroup: it may be silent until the rebalance ends
}

// session is the timeout m is held to: its own, else the group's longest,
// else the fallback.
func (g *groupTrack) session(m *memberTrack) time.Duration {
	switch {
	case m.session != 0:
		return m.session
	case g.maxSession != 0:
		return g.maxSession
	}
	return fallbackSessionTimeout
}

// observe registers control functions that record group requests and never
// handle them (handled=false keeps them registered).
func (e *evictor) observe() {
	keys := []int16{
		int16(kmsg.JoinGroup), int16(kmsg.SyncGroup), int16(kmsg.Heartbeat),
		int16(kmsg.LeaveGroup), int16(kmsg.OffsetCommit), int16(kmsg.ConsumerGroupHeartbeat),
	}
	for _, k := range keys {
		e.cluster.ControlKey(k, func(req kmsg.Request) (kmsg.Response, error, bool) {
			e.record(req, time.Now())
			return nil, nil, false
		})
	}
}

func (e *evictor) group(name string) *groupTrack {
	g := e.groups[name]
	if g == nil {
		g = &groupTrack{members: make(map[string]*memberTrack)}
		e.groups[name] = g
	}
	return g
}

func (e *evictor) record(req kmsg.Request, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	seen := func(group, member string) *memberTrack {
		if member == "" {
			return nil
		}
		g := e.group(group)
		m := g.members[member]
		if m == nil {
			m = &memberTrack{}
			g.members[member] = m
		}
		m.lastSeen = now
		return m
	}
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		g := e.group(r.Group)
		g.classic, g.lastJoin = true, now
		session := time.Duration(r.SessionTimeoutMillis) * time.Millisecond
		g.maxSession = max(g.maxSession, session)
		if m := seen(r.Group, r.MemberID); m != nil {
			m.session, m.joining = session, true
		}
	case *kmsg.SyncGroupRequest:
		if m := seen(r.Group, r.MemberID); m != nil {
			m.joining = false
		}
	case *kmsg.HeartbeatRequest:
		if m := seen(r.Group, r.MemberID); m != nil {
			m.joining = false
		}
	case *kmsg.OffsetCommitRequest:
		seen(r.Group, r.MemberID)
	case *kmsg.LeaveGroupRequest:
		g := e.group(r.Group)
		delete(g.members, r.MemberID)
		for _, m := range r.Members {
			delete(g.members, m.MemberID)
		}
	case *kmsg.ConsumerGroupHeartbeatRequest:
		e.group(r.Group).nextGen = true
	}
}

func (e *evictor) run(ctx context.Context) {
	pg.Every(ctx, e.opts.evictionPollInterval, func() bool {
		for _, ev := range e.findSilent(time.Now()) {
			e.evict(ctx, ev)
		}
		return true
	})
}

// findSilent polls every classic group we know and returns the members
// silent past their session timeout plus the margin. During
// PreparingRebalance a member waiting in JoinGroup is left alone, but one
// that has not rejoined is evicted, as a real broker's heartbeat deadline
// would (a chaos run once collected 20 dead members for 3 live ones). After
// a rebalance every clock restarts: a parked JoinGroup must be answered
// before its member can send SyncGroup.
func (e *evictor) findSilent(now time.Time) []eviction {
	e.mu.Lock()
	names := make([]string, 0, len(e.groups))
	for name, g := range e.groups {
		if g.classic && !g.nextGen {
			names = append(names, name)
		}
	}
	e.mu.Unlock()
	sort.Strings(names)

	var out []eviction
	for _, name := range names {
		// Without e.mu: the control functions run while kfake's loop waits.
		info := e.cluster.GroupInfo(name)

		e.mu.Lock()
		g := e.groups[name]
		if info == nil {
			// kfake may not have handled its first join yet.
			if g.seenPoll || now.Sub(g.lastJoin) > fallbackSessionTimeout {
				delete(e.groups, name)
			}
			e.mu.Unlock()
			continue
		}
		rebalanced := g.seenPoll && (info.Epoch != g.lastEpoch ||
			(g.lastState == "PreparingRebalance" && info.State != g.lastState))
		g.lastState, g.lastEpoch, g.seenPoll = info.State, info.Epoch, true

		present := make(map[string]bool, len(info.Members))
		for _, m := range info.Members {
			present[m.MemberID] = true
			t := g.members[m.MemberID]
			if t == nil {
				// Joined with an empty ID or before a restart: clock starts now.
				g.members[m.MemberID] = &memberTrack{lastSeen: now, listed: true}
				continue
			}
			t.listed = true
			if rebalanced {
				t.lastSeen, t.joining = now, false // its join, if any, was answered
			}
		}
		for id, t := range g.members {
			// Gone, or never listed long after its last request.
			if !present[id] && (t.listed || now.Sub(t.lastSeen) > g.session(t)+e.opts.evictionMargin) {
				delete(g.members, id)
			}
		}
		preparing := info.State == "PreparingRebalance"
		if !preparing && info.State != "CompletingRebalance" && info.State != "Stable" {
			e.mu.Unlock()
			continue
		}
		for _, m := range info.Members {
			t := g.members[m.MemberID]
			if preparing && t.joining {
				continue
			}
			session := g.session(t)
			silent := now.Sub(t.lastSeen)
			if silent <= session+e.opts.evictionMargin {
				continue
			}
			out = append(out, eviction{
				Group: name, MemberID: m.MemberID, InstanceID: m.InstanceID, ClientID: m.ClientID, ClientHost: m.ClientHost,
				State: info.State, Silent: silent, SessionTimeout: session,
			})
			// Do not count it again while the LeaveGroup is in flight.
			t.lastSeen = now
		}
		e.mu.Unlock()
	}
	return out
}

// evict sends the LeaveGroup the member would have sent on a clean shutdown.
func (e *evictor) evict(ctx context.Context, ev eviction) {
	req := &kmsg.LeaveGroupRequest{Group: ev.Group, MemberID: ev.MemberID /* v0-v2 */, Members: []kmsg.LeaveGroupRequestMember{
		{MemberID: ev.MemberID, InstanceID: ev.InstanceID},
	}}

	reqCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := req.RequestWith(reqCtx, e.client)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
		for _, m := range resp.Members {
			err = cmp.Or(err, kerr.ErrorForCode(m.ErrorCode))
		}
	}
	attrs := []any{
		"group", ev.Group, "member_id", ev.MemberID, "client_id", ev.ClientID, "client_host", ev.ClientHost,
		"state", ev.State, "silent", ev.Silent.Round(time.Millisecond), "session_timeout", ev.SessionTimeout,
	}
	if err != nil {
		if ctx.Err() == nil {
			e.opts.Logger.Warn("kafkatest: could not evict silent group member", append(attrs, "err", err)...)
		}
		return
	}
	e.opts.Logger.Info("kafkatest: evicted silent group member", attrs...)
	if e.opts.onEvict != nil {
		e.opts.onEvict(ev)
	}
}
