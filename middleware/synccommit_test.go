package middleware_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/testenv"
	"github.com/claimtx/claimtx/middleware"
)

// statements records the SQL of every statement a pool sends, in or out
// of a batch, and the round trips.
type statements struct {
	mu         sync.Mutex
	sql        []string
	roundTrips int
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sql, s.roundTrips = append(s.sql, d.SQL), s.roundTrips+1
	return ctx
}
func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *statements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.roundTrips++
	return ctx
}
func (s *statements) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sql = append(s.sql, d.SQL)
}
func (s *statements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// take returns what was recorded since the last take.
func (s *statements) take() (sql []string, roundTrips int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sql, roundTrips = s.sql, s.roundTrips
	s.sql, s.roundTrips = nil, 0
	return sql, roundTrips
}

// mentioning counts the statements of sql that contain word.
func mentioning(sql []string, word string) int {
	n := 0
	for _, s := range sql {
		if strings.Contains(s, word) {
			n++
		}
	}
	return n
}

// Claim.SynchronousCommit is the claim transaction's synchronous_commit on
// every path that commits a claim (per message, natural key, batch), seen
// by the handler in its transaction; it is set by the statement that sets
// the lock_timeout, so it costs no statement and no round trip, and with
// it unset nothing about it is sent. The local server has no standby:
// remote_apply commits as local does there (what framework/consumer warns
// about), but the transaction carries it all the same.
func TestSynchronousCommitReachesTheClaimTransaction(t *testing.T) {
	t.Parallel()
	b := naturalSetup(t, 2)
	rec := &statements{}
	// One connection: the session's setting after the transaction is the
	// one the claim ran on.
	st := b.storeWith(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer, cfg.MaxConns = rec, 1 })
	ctx := context.Background()
	var sessionDefault string
	require.NoError(t, st.Pool().QueryRow(ctx, "SHOW synchronous_commit").Scan(&sessionDefault))

	type cost struct{ statements, roundTrips int }
	costs := map[string]map[string]cost{} // path -> setting -> cost
	orderID := int64(0)
	for _, setting := range []string{"", "on", "remote_write", "remote_apply", "local"} {
		want := setting
		if want == "" {
			want = sessionDefault
		}
		var seen []string
		see := func(ctx context.Context, tx pgx.Tx) error {
			var v string
			if err := tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&v); err != nil {
				return err
			}
			seen = append(seen, v)
			return nil
		}
		paths := map[string]func(o order) error{
			"claim_table": func(o order) error {
				c := middleware.Claim{Store: st, Consumer: "sync-" + setting, Key: keyFunc(t), SynchronousCommit: setting, CommittedKeys: -1}
				h := testenv.Install(t, middleware.NewClaim, c)(consume(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
					return errors.Join(see(ctx, tx), credit(ctx, tx, msg))
				}))
				_, err := h(newDelivery(t, o))
				return err
			},
			// The order-key lookup rides in the statement that sets both.
			"ordered": func(o order) error {
				c := middleware.Claim{Store: st, Consumer: "sync-ordered-" + setting, Key: keyFunc(t), OrderKey: customerOrderKey(t), SynchronousCommit: setting, CommittedKeys: -1}
				h := testenv.Install(t, middleware.NewClaim, c)(consume(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
					return errors.Join(see(ctx, tx), credit(ctx, tx, msg))
				}))
				_, err := h(newDelivery(t, o))
				return err
			},
			"natural_key": func(o order) error {
				c := middleware.Claim{Store: st, Consumer: "sync-" + setting, Mode: middleware.ModeNaturalKey, SynchronousCommit: setting}
				h := testenv.Install(t, middleware.NewClaim, c)(consume(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
					if err := see(ctx, tx); err != nil {
						return err
					}
					return creditOnce(ctx, tx, msg)
				}))
				_, err := h(newDelivery(t, o))
				return err
			},
			"batch": func(o order) error {
				bt := newBatch(t, middleware.Claim{Store: st, Consumer: "sync-batch-" + setting, Key: keyFunc(t), SynchronousCommit: setting, CommittedKeys: -1})
				errs := bt.Process(ctx, batchOf(t, o, order{OrderID: o.OrderID + 1000, CustomerID: o.CustomerID, TotalCents: 100}), func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
					return errors.Join(see(ctx, tx), creditSet(ctx, tx, msgs))
				})
				return errors.Join(errs...)
			},
		}
		for name, deliver := range paths {
			orderID++
			seen = nil
			rec.take()
			require.NoError(t, deliver(order{OrderID: orderID, CustomerID: 7, TotalCents: 1000}), "%s %q", name, setting)
			sql, trips := rec.take()
			require.Equal(t, []string{want}, seen, "%s %q: the handler's transaction", name, setting)
			if costs[name] == nil {
				costs[name] = map[string]cost{}
			}
			costs[name][setting] = cost{len(sql), trips}
			if setting == "" {
				require.Zero(t, mentioning(sql, "set_config('synchronous_commit'"), "%s: nothing sent when unset: %q", name, sql)
			} else {
				require.Equal(t, 1, mentioning(sql, "set_config('synchronous_commit'"), "%s %q: %q", name, setting, sql)
				require.Equal(t, 1, mentioning(sql, "set_config('lock_timeout', $1, true), set_config('synchronous_commit', $2, true)"),
					"%s %q: set with the lock_timeout: %q", name, setting, sql)
			}
			// Transaction-local: the session keeps its default.
			var after string
			require.NoError(t, st.Pool().QueryRow(ctx, "SHOW synchronous_commit").Scan(&after))
			require.Equal(t, sessionDefault, after, "%s %q", name, setting)
		}
	}
	for name, bySetting := range costs {
		for setting, c := range bySetting {
			require.Equal(t, bySetting[""], c, "%s %q: the same statements and round trips as unset", name, setting)
		}
	}
}

// "off" would ack a message before its effect is durable: NewClaim and
// NewBatch refuse it, and any value Postgres would not take as one of the
// documented ones, naming the field.
func TestSynchronousCommitRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	for _, tc := range []struct{ value, reason string }{
		{"off", "refused"},
		{"false", "refused"},
		{"ON", "must be on, remote_write, remote_apply or local"},
		{"remote", "must be on, remote_write, remote_apply or local"},
	} {
		c := b.claim(t, "refused", nil)
		c.SynchronousCommit = tc.value
		for name, err := range map[string]error{
			"NewClaim": configErr(middleware.NewClaim, c),
			"NewBatch": func() error { _, err := middleware.NewBatch(c); return err }(),
		} {
			var ce *framework.ConfigError
			require.ErrorAs(t, err, &ce, "%s %q", name, tc.value)
			require.Equal(t, "SynchronousCommit", ce.Field, "%s %q", name, tc.value)
			require.Contains(t, ce.Reason, tc.reason, "%s %q", name, tc.value)
		}
	}
	c := b.claim(t, "off", nil)
	c.SynchronousCommit = "off"
	err := configErr(middleware.NewClaim, c)
	require.ErrorContains(t, err, "a database crash could lose an effect whose message the broker has already forgotten")
}
