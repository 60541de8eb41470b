package kafkatest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A JoinGroup is recorded when kfake receives it, before kfake has handled
// it. A poll in between must not forget what the join said: the member's
// own session timeout (not the group's longest, or the 45s fallback when
// the group itself is not listed yet). TestEvictsSilentMember failed this
// way once in eight -race runs of the suite: its zombie was evicted after
// the live member's 3s session instead of its own 500ms.
func TestJoinRecordedBeforeKfakeListsIt(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	e := &evictor{cluster: c, opts: Options{evictionMargin: 100 * time.Millisecond}, groups: map[string]*groupTrack{}}
	join := func(group, member string, session time.Duration, now time.Time) {
		r := kmsg.NewPtrJoinGroupRequest()
		r.Group, r.MemberID, r.SessionTimeoutMillis = group, member, int32(session/time.Millisecond)
		e.record(r, now)
	}
	now := time.Now()

	// The group's first join: kfake has no such group yet.
	join("new", "m1", 500*time.Millisecond, now)
	require.Empty(t, e.findSilent(now.Add(10*time.Millisecond)))
	require.Contains(t, e.groups, "new", "the group of a join kfake has not handled yet")
	require.Equal(t, 500*time.Millisecond, e.groups["new"].members["m1"].session)

	// A group with a live member (a real client), and a second member whose
	// join kfake has not handled yet.
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumerGroup("live"), kgo.ConsumeTopics("t"),
		kgo.SessionTimeout(3*time.Second))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	go cl.PollFetches(ctx) // joins the group
	_, err = c.WaitGroupStable(ctx, "live", 1)
	require.NoError(t, err)
	join("live", "late", 500*time.Millisecond, time.Now())
	require.Empty(t, e.findSilent(time.Now()))
	require.Contains(t, e.groups["live"].members, "late", "a member whose join kfake has not handled yet")
	require.Equal(t, 500*time.Millisecond, e.groups["live"].members["late"].session)

	// One that never becomes a member is forgotten once its session
	// (plus the margin) has passed, and so is a group kfake never made.
	// (The live member's requests are not recorded here: a minute on, it
	// is silent too.)
	e.findSilent(time.Now().Add(time.Minute))
	require.NotContains(t, e.groups["live"].members, "late")
	require.NotContains(t, e.groups, "new")
}
