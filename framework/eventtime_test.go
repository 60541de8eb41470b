package framework_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
)

func TestTimeSpecs(t *testing.T) {
	t.Parallel()
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err)
		return v.UTC()
	}
	good := []struct {
		spec, payload string
		md            map[string]string
		want          time.Time
	}{
		{"metadata:event_time", `{}`, map[string]string{"event_time": "2024-05-01T10:00:00Z"}, at("2024-05-01T10:00:00Z")},
		{"metadata:event_time", `{}`, map[string]string{"event_time": "2024-05-01T12:00:00.5+02:00"}, at("2024-05-01T10:00:00.5Z")},
		{"metadata:event_time", `{}`, map[string]string{"event_time": " 1714557600 "}, at("2024-05-01T10:00:00Z")},
		{"metadata:event_time", `{}`, map[string]string{"event_time": "1714557600123"}, at("2024-05-01T10:00:00.123Z")},
		{"metadata:event_time", `{}`, map[string]string{"event_time": "1714557600123456"}, at("2024-05-01T10:00:00.123456Z")},
		{"metadata:event_time", `{}`, map[string]string{"event_time": "1714557600123456789"}, at("2024-05-01T10:00:00.123456789Z")},
		{"metadata:event_time", `{}`, map[string]string{"event_time": "1714557600.25"}, at("2024-05-01T10:00:00.25Z")},
		{"json:occurred_at", `{"occurred_at": "2024-05-01T10:00:00Z"}`, nil, at("2024-05-01T10:00:00Z")},
		{"json:occurred_at", `{"occurred_at": 1714557600}`, nil, at("2024-05-01T10:00:00Z")},
		{"json:occurred_at", `{"occurred_at": 1714557600000}`, nil, at("2024-05-01T10:00:00Z")},
		{"json:occurred_at", `{"occurred_at": 1.7145576e9}`, nil, at("2024-05-01T10:00:00Z")},
		{"json:meta.at", `{"meta": {"at": "2024-05-01T10:00:00Z"}}`, nil, at("2024-05-01T10:00:00Z")},
		{"json:events.1", `{"events": [0, "2024-05-01T10:00:00Z"]}`, nil, at("2024-05-01T10:00:00Z")},
		{"kafka:timestamp", `{}`, map[string]string{"kafka_timestamp": "2024-05-01T10:00:00.123456789Z"}, at("2024-05-01T10:00:00.123456789Z")},
		{"kafka", `{}`, map[string]string{"kafka_timestamp": "2024-05-01T10:00:00Z"}, at("2024-05-01T10:00:00Z")},
	}
	for _, tc := range good {
		tf, err := framework.ParseTimeSpec(tc.spec)
		require.NoError(t, err, tc.spec)
		got, err := tf(msgWith(tc.payload, tc.md))
		require.NoError(t, err, "%s %s %v", tc.spec, tc.payload, tc.md)
		require.True(t, tc.want.Equal(got), "%s: got %s want %s", tc.spec, got, tc.want)
		require.Equal(t, time.UTC, got.Location())
		again, err := tf(msgWith(tc.payload, tc.md))
		require.NoError(t, err)
		require.Equal(t, got, again, "a redelivery must read the same time")
	}

	bad := []struct {
		spec, payload string
		md            map[string]string
	}{
		{"metadata:event_time", `{}`, nil},
		{"metadata:event_time", `{}`, map[string]string{"event_time": ""}},
		{"metadata:event_time", `{}`, map[string]string{"event_time": "yesterday"}},
		{"metadata:event_time", `{}`, map[string]string{"event_time": "0"}},
		{"metadata:event_time", `{}`, map[string]string{"event_time": "-5"}},
		{"metadata:event_time", `{}`, map[string]string{"event_time": "1e999999999"}},
		{"metadata:event_time", `{}`, map[string]string{"event_time": "1969-12-31T23:59:59Z"}},
		{"json:occurred_at", `{"occurred_at": null}`, nil},
		{"json:occurred_at", `{"occurred_at": true}`, nil},
		{"json:occurred_at", `{"occurred_at": -1}`, nil},
		{"json:occurred_at", `{"occurred_at": 1e12}`, nil},
		{"json:occurred_at", `{}`, nil},
		{"json:occurred_at", `not json`, nil},
		{"json:a.b", `{"a": 5}`, nil},
		{"json:a.9", `{"a": []}`, nil},
		{"kafka:timestamp", `{}`, nil},
	}
	for _, tc := range bad {
		tf, err := framework.ParseTimeSpec(tc.spec)
		require.NoError(t, err, tc.spec)
		_, err = tf(msgWith(tc.payload, tc.md))
		require.ErrorAs(t, err, new(*framework.EventTimeError), "%s %s %v", tc.spec, tc.payload, tc.md)
		require.True(t, framework.IsPermanent(err))
		var ete *framework.EventTimeError
		require.ErrorAs(t, err, &ete)
		require.NotEmpty(t, ete.Source)
	}

	for _, spec := range []string{"", "  ", "nope:x", "metadata", "metadata:", "json:", "json:a..b", "kafka:offset"} {
		_, err := framework.ParseTimeSpec(spec)
		var ce *framework.ConfigError
		require.ErrorAs(t, err, &ce, "spec %q", spec)
		require.Equal(t, "event_time", ce.Field, "spec %q", spec)
	}
}

func TestTimeRegistry(t *testing.T) {
	t.Parallel()
	r := framework.NewRegistry()
	fixed := time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC)
	require.NoError(t, r.RegisterTime("fixed", func(string) (framework.TimeFunc, error) {
		return func(*message.Message) (time.Time, error) { return fixed, nil }, nil
	}))
	tf, err := r.ParseTime("fixed")
	require.NoError(t, err)
	got, err := tf(msgWith("", nil))
	require.NoError(t, err)
	require.Equal(t, fixed, got)

	var ce *framework.ConfigError
	require.ErrorAs(t, r.RegisterTime("fixed", func(string) (framework.TimeFunc, error) { return nil, nil }), &ce)
	require.ErrorAs(t, r.RegisterTime("metadata", func(string) (framework.TimeFunc, error) { return nil, nil }), &ce)
	require.ErrorAs(t, r.RegisterTime("Bad Name", func(string) (framework.TimeFunc, error) { return nil, nil }), &ce)
	require.ErrorAs(t, r.RegisterTime("nilfactory", nil), &ce)
	require.NoError(t, r.RegisterTime("nilfunc", func(string) (framework.TimeFunc, error) { return nil, nil }))
	_, err = r.ParseTime("nilfunc")
	require.ErrorAs(t, err, &ce)

	// Unknown names are listed with the registry's own, custom ones too;
	// the package-level parser knows only the built-ins.
	_, err = r.ParseTime("nope")
	require.ErrorAs(t, err, &ce)
	require.Contains(t, ce.Reason, "known: fixed, json, kafka, metadata, nilfunc)")
	_, err = framework.ParseTimeSpec("fixed")
	require.ErrorAs(t, err, &ce)
	require.Contains(t, ce.Reason, "known: json, kafka, metadata)")
	// A time extractor is not a key extractor.
	_, err = r.ParseKey("fixed")
	require.ErrorAs(t, err, &ce)
}

func TestExpiredError(t *testing.T) {
	t.Parallel()
	ev := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	err := error(&framework.ExpiredError{EventTime: ev, Horizon: ev.AddDate(0, 0, 10), Retention: 30 * 24 * time.Hour})
	require.ErrorAs(t, err, new(*framework.ExpiredError))
	require.True(t, framework.IsPermanent(err))
	require.Contains(t, err.Error(), "2024-03-01T00:00:00Z")
	require.Contains(t, err.Error(), "retention 30d")
	require.False(t, errors.As(err, new(*framework.KeyError)))
	require.Contains(t, (&framework.ExpiredError{Retention: 90 * time.Minute}).Error(), "1h30m0s")
}
