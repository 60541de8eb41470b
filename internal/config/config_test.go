package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/config"
)

type target struct {
	Name   string `yaml:"name"`
	Secret string `yaml:"secret"`
	Nested struct {
		N int `yaml:"n"`
	} `yaml:"nested"`
}

var settings = []config.Setting[target]{
	{Path: "name", Env: "NAME", Set: func(c *target, v string) error {
		if v == "bad" {
			return errors.New("must not be bad")
		}
		c.Name = v
		return nil
	}},
	{Path: "secret", Env: "SECRET", Secret: true, Set: func(c *target, v string) error {
		if v == "bad" {
			return errors.New("quotes " + v)
		}
		c.Secret = v
		return nil
	}},
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func field(t *testing.T, err error) *framework.ConfigError {
	t.Helper()
	var ce *framework.ConfigError
	require.ErrorAs(t, err, &ce)
	return ce
}

func TestApplyEnv(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "secret")
	require.NoError(t, os.WriteFile(file, []byte("s3cret\n"), 0o600))
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))

	var c target
	seen := map[string]string{}
	err := config.ApplyEnv(&c, settings, env(map[string]string{"NAME": " app ", "SECRET_FILE": file}),
		func(s config.Setting[target], name string) { seen[s.Path] = name })
	require.NoError(t, err)
	require.Equal(t, target{Name: "app", Secret: "s3cret"}, c)
	require.Equal(t, map[string]string{"name": "NAME", "secret": "SECRET_FILE"}, seen)

	for _, tc := range []struct {
		env         map[string]string
		field, want string
	}{
		{map[string]string{"NAME": "bad"}, "NAME", "must not be bad"},
		{map[string]string{"SECRET": "bad"}, "SECRET", "cannot be used"},
		{map[string]string{"SECRET": "x", "SECRET_FILE": file}, "SECRET_FILE", "not both"},
		{map[string]string{"SECRET_FILE": filepath.Join(dir, "missing")}, "SECRET_FILE", "cannot read the file"},
		{map[string]string{"SECRET_FILE": empty}, "SECRET_FILE", "is empty"},
	} {
		ce := field(t, config.ApplyEnv(&target{}, settings, env(tc.env), nil))
		require.Equal(t, tc.field, ce.Field)
		require.Contains(t, ce.Reason, tc.want)
		require.NotContains(t, ce.Error(), "quotes bad", "a secret's value is never quoted")
	}
	require.NoError(t, config.ApplyEnv(&c, settings, env(map[string]string{"NAME": "  "}), nil), "empty counts as unset")
}

func TestDecode(t *testing.T) {
	t.Parallel()
	var c target
	require.NoError(t, config.Decode(nil, &c))
	require.NoError(t, config.Decode([]byte("name: a\nnested:\n  n: 2\n"), &c))
	require.Equal(t, 2, c.Nested.N)
	ce := field(t, config.Decode([]byte("name: a\nnested:\n  n: two\n"), &c))
	require.Equal(t, "nested.n", ce.Field)
	require.Contains(t, ce.Reason, "line 3")
	ce = field(t, config.Decode([]byte("nme: a\n"), &c))
	require.Equal(t, "nme", ce.Field)
	err := config.Decode([]byte("name: [\n"), &c)
	require.ErrorContains(t, err, "parse YAML")
}

func TestRedaction(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://app:pw-1@db:5432/app?sslmode=disable",
		"postgres://app@db/app?password=pw-1",
		"host=db user=app password=pw-1 dbname=app",
		"host=db user=app password='pw-1 with space' dbname=app",
		"host=db user=app password='pw-1 unterminated",
		"postgres://app:pw-1@db:port/app",
	} {
		out := config.RedactDSN(dsn)
		require.NotContains(t, out, "pw-1", dsn)
		require.Contains(t, out, config.Mask, dsn)
		found := false
		for _, pw := range config.Passwords(dsn) {
			found = found || strings.Contains(pw, "pw-1")
		}
		require.True(t, found, dsn)
	}
	require.Equal(t, "amqp://u:xxxxx@rabbit/", config.RedactURL("amqp://u:pw@rabbit/"))
	require.Equal(t, "", config.Redact(""))
	require.Equal(t, config.Mask, config.Redact("pw"))
	require.Equal(t, "a xxxxx b xxxxx", config.Scrub("a pw b pw", "", "pw"))
	require.Contains(t, config.Passwords("postgres://u:p%40ss@db/x"), "p%40ss", "as written in the URL too")
}
