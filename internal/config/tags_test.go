package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/config"
)

type section struct {
	URL   string        `yaml:"url" env:"T_URL,secret" default:"amqp://u:pw@host/"`
	N     int           `yaml:"n" env:"T_N,positive" default:"4"`
	Delta int           `yaml:"delta" env:"T_DELTA,nonzero" default:"-1"`
	Wait  time.Duration `yaml:"wait" env:"T_WAIT" default:"1s"`
	Hosts []string      `yaml:"hosts" env:"T_HOSTS" default:"a:1"`
	On    bool          `yaml:"on" env:"T_ON"`
	Plain string        `yaml:"plain"`
}

type tagged struct {
	Kind string  `yaml:"kind" env:"T_KIND" default:"x"`
	Sec  section `yaml:"sec"`
	Pass string  `yaml:"pass" env:"T_PASS,secret"`
}

// TestTags: the tags of a Config's fields are its settings, its defaults
// and what printing it redacts.
func TestTags(t *testing.T) {
	t.Parallel()
	var paths []string
	for _, s := range config.Settings[tagged]() {
		paths = append(paths, s.Path+"="+s.Env)
	}
	require.Equal(t, []string{"kind=T_KIND", "sec.url=T_URL", "sec.n=T_N", "sec.delta=T_DELTA", "sec.wait=T_WAIT", "sec.hosts=T_HOSTS", "sec.on=T_ON", "pass=T_PASS"}, paths)

	d := config.Defaults(tagged{Sec: section{N: 9}})
	require.Equal(t, tagged{Kind: "x", Sec: section{URL: "amqp://u:pw@host/", N: 9, Delta: -1, Wait: time.Second, Hosts: []string{"a:1"}}}, d)

	var c tagged
	require.NoError(t, config.ApplyEnv(&c, config.Settings[tagged](), env(map[string]string{
		"T_N": "2", "T_WAIT": "5ms", "T_HOSTS": " b:2, ,c:3 ", "T_ON": "true", "T_PASS": "s3cret",
	}), nil))
	require.Equal(t, tagged{Sec: section{N: 2, Wait: 5 * time.Millisecond, Hosts: []string{"b:2", "c:3"}, On: true}, Pass: "s3cret"}, c)
	for name, want := range map[string]string{
		"T_N=0": "positive integer", "T_DELTA=0": "non-zero", "T_WAIT=soon": "duration", "T_HOSTS=,": "at least one", "T_ON=maybe": "true or false",
	} {
		k, v, _ := strings.Cut(name, "=")
		ce := field(t, config.ApplyEnv(&c, config.Settings[tagged](), env(map[string]string{k: v}), nil))
		require.Equal(t, k, ce.Field)
		require.Contains(t, ce.Reason, want, name)
	}

	out := config.Format(config.Defaults(tagged{Pass: "s3cret"}))
	require.NotContains(t, out, "s3cret")
	require.NotContains(t, out, ":pw@")
	require.Contains(t, out, `URL:"amqp://u:xxxxx@host/"`)
	require.Contains(t, out, `Pass:"xxxxx"`)
	require.Contains(t, out, "Wait:1s")
}

type bound struct {
	Name  string
	Inner struct{ Min time.Duration }
	Count int
}

// TestBind: a table's settings without Set are parsed by their field's
// type and rule.
func TestBind(t *testing.T) {
	t.Parallel()
	settings := config.Bind([]config.Setting[bound]{
		{Path: "name", Env: "B_NAME", Field: "Name"},
		{Path: "inner.min", Env: "B_MIN", Field: "Inner.Min", Rule: "min=1"},
		{Path: "count", Env: "B_COUNT", Field: "Count", Rule: "min=-1"},
	})
	var c bound
	require.NoError(t, config.ApplyEnv(&c, settings, env(map[string]string{"B_NAME": "n", "B_MIN": "2s", "B_COUNT": "-1"}), nil))
	require.Equal(t, "n", c.Name)
	require.Equal(t, 2*time.Second, c.Inner.Min)
	require.Equal(t, -1, c.Count)
	require.Contains(t, field(t, config.ApplyEnv(&c, settings, env(map[string]string{"B_MIN": "0s"}), nil)).Reason, "positive")
	require.Contains(t, field(t, config.ApplyEnv(&c, settings, env(map[string]string{"B_COUNT": "-2"}), nil)).Reason, "at least -1")
	require.Panics(t, func() { config.Bind([]config.Setting[bound]{{Field: "Nope"}}) })
}

// TestRename: a ConfigError's field is renamed on a copy; other errors pass.
func TestRename(t *testing.T) {
	t.Parallel()
	orig := &framework.ConfigError{Field: "a", Reason: "r"}
	err := config.Rename(orig, func(f string) (string, bool) { return "x." + f, true })
	require.Equal(t, "x.a", field(t, err).Field)
	require.Equal(t, "a", orig.Field)
	require.Same(t, orig, config.Rename(orig, func(string) (string, bool) { return "", false }))
	plain := errors.New("plain")
	require.Same(t, plain, config.Rename(plain, func(string) (string, bool) { return "y", true }))
	require.NoError(t, config.Rename(nil, func(string) (string, bool) { return "y", true }))
}
