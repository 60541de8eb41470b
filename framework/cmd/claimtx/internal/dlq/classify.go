package dlq

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/pg"
	_ "github.com/claimtx/claimtx/store" // sets pg.MemosOf
)

// Memo is the poison memo (pg.Memos). With one,
// classification reports ClassMemo for a memo without a claim, and Replay
// clears a key's memo before it republishes it (a crash in between leaves
// the letter with its memo gone: harmless).
type Memo interface {
	// Memoised returns which of keys have a memo for consumer.
	Memoised(ctx context.Context, consumer string, keys []string) (map[string]bool, error)
	// Clear removes the memos of consumer for keys.
	Clear(ctx context.Context, consumer string, keys []string) error
}

// MemoOf is the poison memo table of names, or nil when the schema
// predates it.
func MemoOf(ctx context.Context, pool *pgxpool.Pool, names *pg.Names) (Memo, error) {
	memos := pg.MemosOf(pool, names)
	ok, err := memos.Exists(ctx)
	if err != nil || !ok {
		return nil, err
	}
	return memoTable{memos}, nil
}

type memoTable struct{ pg.Memos }

func (t memoTable) Clear(ctx context.Context, consumer string, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	_, err := t.Memos.Clear(ctx, pg.MemoFilter{Consumer: consumer, Keys: keys})
	return err
}

// Classifier classifies letters against a consumer's claims.
type Classifier struct {
	Pool          *pgxpool.Pool
	Schema, Table string // the claims table, names store.Config validated
	Consumer      string
	Key           framework.KeyFunc // today's key spec
	Policy        framework.KeyPolicy
	Memo          Memo // optional

	lookup string
}

var errNoKeyFunc = errors.New("dlq: Classifier.Key is nil")

// Classify sets Key, KeyErr, Class and Match of every letter, with one
// claims query for all of them.
func (c *Classifier) Classify(ctx context.Context, letters []*Letter) error {
	if c.Key == nil {
		return errNoKeyFunc
	}
	if c.lookup == "" {
		c.lookup = pg.NewNames(c.Schema, c.Table, "").Render(
			"SELECT message_key, payload_hash FROM {schema}.{claims} WHERE consumer = $1 AND message_key = ANY($2::text[])")
	}
	var keys []string
	for _, l := range letters {
		l.Key, l.KeyErr, l.Match = "", nil, ""
		k, err := DeriveKey(c.Key, c.Policy, l.Msg)
		if err != nil {
			l.KeyErr, l.Class = err, ClassStillBad
			continue
		}
		l.Key = k
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil
	}
	// A partitioned claim table may hold one key on several event days
	// (a producer bug); any row equal to the payload counts as the same.
	claims := make(map[string][][]byte, len(keys))
	rows, err := c.Pool.Query(ctx, c.lookup, c.Consumer, keys)
	if err != nil {
		return fmt.Errorf("look up claims: %w", err)
	}
	var k string
	var hash []byte // Scan copies a bytea: each append keeps its own
	if _, err := pgx.ForEachRow(rows, []any{&k, &hash}, func() error { claims[k] = append(claims[k], hash); return nil }); err != nil {
		return fmt.Errorf("look up claims: %w", err)
	}
	var memos map[string]bool
	if c.Memo != nil {
		if memos, err = c.Memo.Memoised(ctx, c.Consumer, keys); err != nil {
			return fmt.Errorf("look up poison memos: %w", err)
		}
	}
	for _, l := range letters {
		if l.KeyErr != nil {
			continue
		}
		hashes, claimed := claims[l.Key]
		switch {
		case claimed:
			l.Class, l.Match = ClassApplied, match(l.Fingerprint(), hashes)
		case memos[l.Key]:
			l.Class = ClassMemo
		default:
			l.Class = ClassWouldApply
		}
	}
	return nil
}

// DeriveKey is the claim key kf and policy give msg, as the consumer
// derives it. A panicking key function (an extractor's bug) is an error
// about that message, not the end of the check.
func DeriveKey(kf framework.KeyFunc, policy framework.KeyPolicy, msg *message.Message) (key string, err error) {
	defer func() {
		if r := recover(); r != nil {
			key, err = "", fmt.Errorf("the key function panicked: %v", r)
		}
	}()
	k, err := kf(msg)
	if err != nil {
		return "", err
	}
	return policy.Normalize(k)
}

func match(fp []byte, hashes [][]byte) Match {
	recorded := false
	for _, h := range hashes {
		if bytes.Equal(h, fp) { // fp is 16 bytes: never a nil h
			return MatchSame
		}
		recorded = recorded || h != nil
	}
	if !recorded {
		return MatchUnrecorded
	}
	return MatchDifferent
}
