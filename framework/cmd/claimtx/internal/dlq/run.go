package dlq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// settleGrace bounds how long an interrupted replay waits for the batch in
// flight to be confirmed and removed.
const settleGrace = 30 * time.Second

// Filter selects letters. The zero Filter selects every letter.
type Filter struct {
	// Consumer, when set, passes over copies stamped by another consumer
	// (a poison destination several consumers of one topic share). Copies
	// without the stamp are taken to be this consumer's.
	Consumer string
	// Topic, when set, passes over copies consumed from another topic.
	// Copies that do not say are taken to come from it.
	Topic string
	// ID selects the letter with this message UUID.
	ID string
	// IDs, when not empty, selects the letters with these message UUIDs
	// (the web console's "replay the selected letters").
	IDs []string
	// Reason selects letters whose poison reason contains it.
	Reason string
	// Key selects letters whose key (today's, when classified, else the
	// stamped one) is exactly it.
	Key string
	// OlderThan and NewerThan select by the time since the copy was
	// poisoned; a copy without a poison time matches neither.
	OlderThan, NewerThan time.Duration
	// Now is the clock of the age filters. Defaults to time.Now().
	Now time.Time
}

// pass says why l is not this consumer's or topic's business ("" when it
// is), and whether because of the consumer.
func (f Filter) pass(l *Letter) (why string, otherConsumer bool) {
	switch {
	case f.Consumer != "" && l.Stamps.Consumer != "" && l.Stamps.Consumer != f.Consumer:
		return fmt.Sprintf("poisoned by consumer %q", l.Stamps.Consumer), true
	case f.Topic != "" && l.Stamps.Topic != "" && l.Stamps.Topic != f.Topic:
		return fmt.Sprintf("consumed from topic %q", l.Stamps.Topic), false
	}
	return "", false
}

// keep says why the operator's filters leave l out, or "".
func (f Filter) keep(l *Letter, now time.Time) string {
	if f.ID != "" && l.Msg.UUID != f.ID {
		return "id does not match --id"
	}
	if len(f.IDs) > 0 && !slices.Contains(f.IDs, l.Msg.UUID) {
		return "not among the selected ids"
	}
	if f.Reason != "" && !strings.Contains(l.Stamps.Reason, f.Reason) {
		return "reason does not match --reason"
	}
	if f.Key != "" && EffectiveKey(l) != f.Key {
		return "key does not match --key"
	}
	if f.OlderThan > 0 || f.NewerThan > 0 {
		age, ok := l.Age(now)
		switch {
		case !ok:
			return "no poison time to compare with --older-than/--newer-than"
		case f.OlderThan > 0 && age < f.OlderThan:
			return "newer than --older-than"
		case f.NewerThan > 0 && age > f.NewerThan:
			return "older than --newer-than"
		}
	}
	return ""
}

// EffectiveKey is today's key of l when it was classified, else the key
// it was stamped with when poisoned.
func EffectiveKey(l *Letter) string {
	if l.Class != "" {
		return l.Key
	}
	return l.Stamps.Key
}

// Totals count what a browse or replay saw and did.
type Totals struct {
	Seen             int64 // read from the destination
	Selected         int64 // matched the filters (and the consumer and topic)
	OtherConsumer    int64 // stamped by another consumer
	OtherTopic       int64 // consumed from another topic
	FilteredOut      int64 // left out by the operator's filters
	Applied          int64 // ClassApplied
	AppliedDifferent int64 // of them, with a different payload fingerprint
	WouldApply       int64
	StillBad         int64
	Memo             int64
	// Repeated counts the selected letters that are copies of an earlier
	// one (Letter.CopyOf); the classes above count each message once.
	Repeated int64
	Replayed int64 // republished and confirmed
}

func (t *Totals) count(l *Letter) {
	switch l.Class {
	case ClassApplied:
		t.Applied++
		if l.Match == MatchDifferent {
			t.AppliedDifferent++
		}
	case ClassWouldApply:
		t.WouldApply++
	case ClassStillBad:
		t.StillBad++
	case ClassMemo:
		t.Memo++
	}
}

// Run configures Browse and Replay.
type Run struct {
	Source Source
	Filter Filter
	// Classifier, when set, classifies every letter that passes the
	// consumer and topic check. Required by Replay.
	Classifier *Classifier
	// Topic is where a letter is republished when it does not name the
	// topic it was consumed from. Required by Replay.
	Topic string
	// BatchSize is how many letters are read, classified and republished
	// at once (one claims query, one wait for the broker's confirms).
	// Defaults to 500.
	BatchSize int
	// Limit, when > 0, stops after this many selected letters.
	Limit int64
	// DryRun classifies and decides without republishing anything.
	DryRun bool
	// IncludeApplied replays already applied letters too (duplicates for
	// their claims, harmless).
	IncludeApplied bool
	// Rate, when > 0, bounds the replay to this many letters per second,
	// so a consumer is not flooded.
	Rate float64
	// OnLetter is called for every letter read, once decided (and, in a
	// replay, settled), in destination order.
	OnLetter func(*Letter) error
	// OnBatch is called after every batch with the running totals.
	OnBatch func(Totals)
}

func (r *Run) batchSize() int {
	if r.BatchSize > 0 {
		return r.BatchSize
	}
	return 500
}

// Browse reads the whole destination (up to Limit selected letters),
// classifying when a Classifier is set, and calls OnLetter for each
// letter that is the consumer's and topic's and matches the filters. It
// changes nothing.
func (r *Run) Browse(ctx context.Context) (Totals, error) {
	return r.run(ctx, false)
}

// Replay republishes the selected letters (see the package
// documentation); with DryRun it only decides.
func (r *Run) Replay(ctx context.Context) (Totals, error) {
	if r.Classifier == nil {
		return Totals{}, errors.New("dlq: Replay needs a Classifier")
	}
	if r.Topic == "" {
		return Totals{}, errors.New("dlq: Replay needs the original topic")
	}
	return r.run(ctx, true)
}

func (r *Run) run(ctx context.Context, replay bool) (Totals, error) {
	var t Totals
	now := r.Filter.Now
	if now.IsZero() {
		now = time.Now()
	}
	start := time.Now()
	firsts := map[string]string{} // a message's identity -> the Position of its first copy
	for r.Limit <= 0 || t.Selected < r.Limit {
		if err := ctx.Err(); err != nil {
			return t, err
		}
		batch, err := r.Source.Next(ctx, r.batchSize())
		if errors.Is(err, io.EOF) {
			return t, nil
		}
		t.Seen += int64(len(batch))
		if err != nil {
			return t, err
		}
		var mine []*Letter
		for _, l := range batch {
			why, otherConsumer := r.Filter.pass(l)
			l.Action, l.Why, l.Selected = ActionPass, why, false
			switch {
			case why == "":
				mine = append(mine, l)
			case otherConsumer:
				t.OtherConsumer++
			default:
				t.OtherTopic++
			}
		}
		if r.Classifier != nil && len(mine) > 0 {
			if err := r.Classifier.Classify(ctx, mine); err != nil {
				return t, err
			}
		}
		for _, l := range mine {
			if why := r.Filter.keep(l, now); why != "" {
				l.Action, l.Why = ActionKeep, why
				t.FilteredOut++
				continue
			}
			if r.Limit > 0 && t.Selected >= r.Limit {
				l.Action, l.Why = ActionKeep, "past --limit"
				continue
			}
			t.Selected++
			l.Selected = true
			l.Action, l.Why = r.decide(l)
			r.markCopy(l, firsts, &t)
		}
		var settleErr error
		if replay && !r.DryRun {
			// An interruption (ctx) lets the batch in flight finish, so
			// what was republished is also removed: the rerun then has
			// fewer duplicates to make. A broker that does not answer is
			// not waited for beyond settleGrace.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleGrace)
			if settleErr = r.clearMemos(sctx, batch); settleErr == nil {
				settleErr = r.Source.Settle(sctx, batch, r.target)
			}
			cancel()
			for _, l := range batch {
				if l.Replayed {
					t.Replayed++
				}
			}
		}
		if r.OnLetter != nil {
			for _, l := range batch {
				if !replay && !l.Selected {
					continue // a browse shows what the filters select
				}
				if err := r.OnLetter(l); err != nil {
					return t, errors.Join(settleErr, err)
				}
			}
		}
		if settleErr != nil {
			return t, settleErr
		}
		if r.OnBatch != nil {
			r.OnBatch(t)
		}
		if replay && !r.DryRun && r.Rate > 0 {
			// Pace: t.Replayed letters should have taken this long.
			due := start.Add(time.Duration(float64(t.Replayed) / r.Rate * float64(time.Second)))
			if wait := time.Until(due); wait > 0 {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
					return t, ctx.Err()
				}
			}
		}
	}
	return t, nil
}

// decide is the replay action of a selected letter.
func (r *Run) decide(l *Letter) (Action, string) {
	switch l.Class {
	case ClassWouldApply, ClassMemo:
		return ActionReplay, ""
	case ClassApplied:
		if r.IncludeApplied {
			return ActionReplay, ""
		}
		return ActionPass, "already applied (--include-applied replays it as a duplicate)"
	case ClassStillBad:
		return ActionKeep, "today's key spec cannot key it: it would be poisoned again"
	}
	// Not classified (Browse without a Classifier).
	return ActionKeep, ""
}

// markCopy counts l, a selected letter, unless it is a copy of a letter
// firsts holds: then it is marked as one and, where the first copy is
// replayed, passed over, so the message is sent once.
func (r *Run) markCopy(l *Letter, firsts map[string]string, t *Totals) {
	id := EffectiveKey(l)
	if id == "" {
		id = "id:" + l.Msg.UUID
	}
	id = strings.Join([]string{r.target(l), l.Stamps.Consumer, id, l.FingerprintHex()}, "\x00")
	first, seen := firsts[id]
	if !seen {
		firsts[id] = l.Position
		t.count(l)
		return
	}
	l.CopyOf = first
	t.Repeated++
	if l.Action == ActionReplay {
		l.Action, l.Why = ActionPass, "another copy of "+first+", which the replay sends"
	}
}

// target is the topic a letter goes back to: the one it was consumed from.
func (r *Run) target(l *Letter) string {
	if l.Stamps.Topic != "" {
		return l.Stamps.Topic
	}
	return r.Topic
}

// clearMemos clears the poison memos of the letters about to be
// republished, before they are: replaying a memoised key would otherwise
// send it straight back to the poison destination. A no-op without
// Classifier.Memo.
func (r *Run) clearMemos(ctx context.Context, batch []*Letter) error {
	m := r.Classifier.Memo
	if m == nil {
		return nil
	}
	var keys []string
	for _, l := range batch {
		if l.Action == ActionReplay && l.Key != "" {
			keys = append(keys, l.Key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	if err := m.Clear(ctx, r.Classifier.Consumer, keys); err != nil {
		return fmt.Errorf("clear the poison memos of the replayed keys: %w", err)
	}
	return nil
}
