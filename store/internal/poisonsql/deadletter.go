// Package poisonsql keeps, in <claims table>_dead_letter (migration 006),
// the messages whose poisoned copy the broker refused for good
// (middleware.Poison.DeadLetters), so the original can be acked instead of
// coming back forever.
package poisonsql

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/claimtx/claimtx/internal/pg"
	"github.com/claimtx/claimtx/internal/poison"
)

// Letter is one row.
type Letter = pg.DeadLetter

// CanRecord reports whether the current role may insert into the
// dead-letter table: false when it does not exist or the role lacks INSERT
// (granted rights before the table existed).
func CanRecord(ctx context.Context, db pg.DB, n *pg.Names) (bool, error) {
	exists, lacking, err := Lacking(ctx, db, n.Render("{schema}.{dead_letter}"), "INSERT")
	return err == nil && exists && len(lacking) == 0, pg.Wrap(err, "claimtx: check privileges on the dead-letter table")
}

// Record inserts l, a row for every refused copy (as a copy poisoned twice
// is in the poison destination twice), and returns once it is committed.
func Record(ctx context.Context, db pg.DB, n *pg.Names, l Letter) error {
	md, err := EncodeMetadata(l.Metadata)
	if err != nil {
		return fmt.Errorf("claimtx: record dead letter: %w", err)
	}
	var key *string // NULL when there is none
	if l.Key != "" {
		key = new(pg.Text(l.Key))
	}
	publishErr, _ := poison.BoundReason(l.PublishError, poison.MaxReasonBytes)
	reason, _ := poison.BoundReason(l.Reason, poison.MaxReasonBytes)
	payload := l.Payload
	if payload == nil {
		payload = []byte{} // NOT NULL: an empty message is still a message
	}
	if _, err := db.Exec(ctx, n.Render(`INSERT INTO {schema}.{dead_letter}
(consumer, message_key, topic, poison_topic, uuid, reason, permanent, publish_error, payload, metadata)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`),
		// md as a string: in pgx's exec and simple_protocol modes (behind
		// a pooler) a []byte goes as bytea, which jsonb refuses.
		pg.Text(l.Consumer), key, pg.Text(l.Topic), pg.Text(l.PoisonTopic), pg.Text(l.UUID), reason, l.Permanent, publishErr, payload, string(md)); err != nil {
		return fmt.Errorf("claimtx: record dead letter in %s.%s: %w", n.Schema, n.DeadLetter, err)
	}
	return nil
}

// EncodeMetadata renders md as a jsonb object of strings. A value that
// cannot be a jsonb string becomes {"base64": "<its bytes>"}; a key that
// cannot be one "base64:<its bytes>", with its value in that form too.
// DecodeMetadata reverses it exactly: a value is an object only when
// encoded.
func EncodeMetadata(md map[string]string) ([]byte, error) {
	out := make(map[string]any, len(md))
	for k, v := range md {
		switch {
		case !pg.Storable(k):
			out["base64:"+base64.StdEncoding.EncodeToString([]byte(k))] = map[string]string{"base64": base64.StdEncoding.EncodeToString([]byte(v))}
		case !pg.Storable(v):
			out[k] = map[string]string{"base64": base64.StdEncoding.EncodeToString([]byte(v))}
		default:
			out[k] = v
		}
	}
	return json.Marshal(out)
}

// DecodeMetadata returns the metadata EncodeMetadata rendered as data.
func DecodeMetadata(data []byte) (map[string]string, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("claimtx: decode metadata: %w", err)
	}
	md := make(map[string]string, len(raw))
	for k, v := range raw {
		var s string
		if err := json.Unmarshal(v, &s); err == nil {
			md[k] = s
			continue
		}
		var enc struct{ Base64 string }
		if err := json.Unmarshal(v, &enc); err != nil {
			return nil, fmt.Errorf("claimtx: decode metadata %q: %w", k, err)
		}
		b, err := base64.StdEncoding.DecodeString(enc.Base64)
		if err != nil {
			return nil, fmt.Errorf("claimtx: decode metadata %q: %w", k, err)
		}
		if rest, ok := strings.CutPrefix(k, "base64:"); ok {
			kb, err := base64.StdEncoding.DecodeString(rest)
			if err != nil {
				return nil, fmt.Errorf("claimtx: decode metadata key %q: %w", k, err)
			}
			k = string(kb)
		}
		md[k] = string(b)
	}
	return md, nil
}
