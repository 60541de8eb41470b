package dlq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// settleGrace bounds an interrupted replay's wait for its batch in flight.
const settleGrace = 30 * time.Second

// Filter selects letters. The zero Filter selects every letter.
type Filter struct {
	// Consumer and Topic pass over copies stamped with another consumer or
	// source topic (a shared poison destination); unstamped copies match.
	Consumer, Topic string
	ID              string   // this message UUID only
	IDs             []string // these UUIDs only (the console's selection)
	Reason          string   // the poison reason contains it
	Key             string   // EffectiveKey is exactly it
	// OlderThan and NewerThan select by the time since the copy was
	// poisoned; a copy without a poison time matches neither.
	OlderThan, NewerThan time.Duration
	Now                  time.Time // the age filters' clock; default time.Now()
}

// pass says why l is another consumer's or topic's ("" when not).
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
	Selected         int64 // matched the consumer, topic and filters
	OtherConsumer    int64 // stamped by another consumer
	OtherTopic       int64 // consumed from another topic
	FilteredOut      int64 // left out by the operator's filters
	Applied          int64 // ClassApplied
	AppliedDifferent int64 // of them, with a different payload fingerprint
	WouldApply       int64
	StillBad         int64
	Memo             int64
	Repeated         int64 // copies of an earlier letter (CopyOf), not in the classes
	Replayed         int64 // republished and confirmed
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
	Source     Source
	Filter     Filter
	Classifier *Classifier // classifies the consumer's letters; required by Replay
	// Topic receives a letter that does not name its source topic;
	// required by Replay.
	Topic string
	// BatchSize letters share one claims query and one wait for the
	// broker's confirms. Defaults to 500.
	BatchSize      int
	Limit          int64   // > 0: stop after this many selected letters
	DryRun         bool    // decide, republish nothing
	IncludeApplied bool    // replay already applied letters too (harmless duplicates)
	Rate           float64 // > 0: at most this many letters per second
	// OnLetter gets every letter read, once decided (and settled), in
	// destination order; OnBatch the running totals after each batch.
	OnLetter func(*Letter) error
	OnBatch  func(Totals)
}

func (r *Run) batchSize() int {
	if r.BatchSize > 0 {
		return r.BatchSize
	}
	return 500
}

// Browse reads the destination (up to Limit selected letters) and calls
// OnLetter for each selected one. It changes nothing.
func (r *Run) Browse(ctx context.Context) (Totals, error) {
	return r.run(ctx, false)
}

// Replay republishes the selected letters; with DryRun it only decides.
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
	now := cmp.Or(r.Filter.Now, time.Now())
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
			// An interruption lets the batch in flight settle (up to
			// settleGrace): what was republished is removed too.
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

// markCopy counts l unless it is a copy of a letter in firsts: then it is
// marked as one and passed over, so the message is sent once.
func (r *Run) markCopy(l *Letter, firsts map[string]string, t *Totals) {
	id := strings.Join([]string{r.target(l), l.Stamps.Consumer, cmp.Or(EffectiveKey(l), "id:"+l.Msg.UUID), l.FingerprintHex()}, "\x00")
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

// target is the topic l was consumed from.
func (r *Run) target(l *Letter) string { return cmp.Or(l.Stamps.Topic, r.Topic) }

// clearMemos clears the memos of the letters about to be republished:
// a memoised key would go straight back to the poison destination.
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
