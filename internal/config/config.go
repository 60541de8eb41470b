// Package config loads brokers.Config and framework/consumer.Config (strict
// YAML, the environment over it, secrets from _FILE variables, errors that
// name what the user wrote) and redacts connection-string passwords.
package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"

	"github.com/claimtx/claimtx/framework"
)

// Setting is one key of a file and the variable that overrides it.
type Setting[T any] struct {
	Path  string // YAML path: "claim.max_claim_wait"
	Env   string // variable: "CLAIM_MAX_CLAIM_WAIT"
	Field string // Go path ("Claim.MaxClaimWait") errors use and Bind binds
	// Set parses v into c; its error's text is the ConfigError's reason.
	Set    func(c *T, v string) error
	Secret bool   // never quoted in errors; may come from Env+"_FILE"
	Rule   string // how Bind parses the value: env tag options ("min=1")
}

// FileSuffix names the variable with the path of a secret's file
// (AMQP_URL_FILE), which keeps it out of the environment that other
// processes can read (/proc/PID/environ) and crash reporters collect.
const FileSuffix = "_FILE"

// ApplyEnv applies to c each setting's variable that lookup finds set and
// not empty, and calls seen (when not nil) with the variable it came from.
// A value that cannot be used is a *framework.ConfigError naming it.
func ApplyEnv[T any](c *T, settings []Setting[T], lookup func(string) (string, bool), seen func(s Setting[T], name string)) error {
	get := func(name string) (string, bool) {
		v, ok := lookup(name)
		v = strings.TrimSpace(v)
		return v, ok && v != ""
	}
	for _, s := range settings {
		v, ok := get(s.Env)
		name := s.Env
		if s.Secret {
			fileVar := s.Env + FileSuffix
			if p, fromFile := get(fileVar); fromFile {
				if ok {
					return &framework.ConfigError{Field: fileVar, Reason: fmt.Sprintf("set %s or %s, not both", s.Env, fileVar)}
				}
				b, err := os.ReadFile(p) //nolint:gosec // reading the file the operator names is the point
				if err != nil {
					// *fs.PathError names the path and the cause, never the content.
					return &framework.ConfigError{Field: fileVar, Reason: fmt.Sprintf("cannot read the file: %v", err)}
				}
				// A trailing newline is what editors and `echo` leave behind.
				if v = strings.TrimSpace(string(b)); v == "" {
					return &framework.ConfigError{Field: fileVar, Reason: fmt.Sprintf("the file %s is empty", p)}
				}
				ok, name = true, fileVar
			}
		}
		if !ok {
			continue
		}
		if err := s.Set(c, v); err != nil {
			return parseError(name, s.Secret, err, "")
		}
		if seen != nil {
			seen(s, name)
		}
	}
	return nil
}

// parseError is the ConfigError for a value Set refused: err's text, not
// for a secret or a SafeError, whose text may quote the value.
func parseError(field string, secret bool, err error, suffix string) *framework.ConfigError {
	var se SafeError
	isSafe := errors.As(err, &se)
	ce := &framework.ConfigError{Field: field, Reason: err.Error() + suffix}
	if secret || isSafe {
		ce.Reason = "cannot be used" + suffix
	}
	if isSafe {
		ce.Err = se
	}
	return ce
}

// Rename returns a copy of err's *framework.ConfigError with the Field
// rename answers for it, when it answers; err otherwise.
func Rename(err error, rename func(field string) (string, bool)) error {
	var ce *framework.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	if name, ok := rename(ce.Field); ok {
		out := *ce
		out.Field = name
		return &out
	}
	return err
}

// SafeError is an error whose text holds no secret; the one it unwraps to
// may.
type SafeError struct {
	Msg string
	Err error
}

func (e SafeError) Error() string { return e.Msg }
func (e SafeError) Unwrap() error { return e.Err }

var namers, sections sync.Map // reflect.Type of T -> func(T, error) error, func([]byte) (T, error)

// RegisterNamer records how a package names the field of an error about
// its Config T, without exporting it.
func RegisterNamer[T any](named func(c T, err error) error) {
	namers.Store(reflect.TypeFor[T](), named)
}

// Named is err named as the package of T names its own errors about c.
func Named[T any](c T, err error) error {
	if f, ok := namers.Load(reflect.TypeFor[T]()); ok {
		return f.(func(T, error) error)(c, err)
	}
	return err
}

// RegisterSection records how a package loads its Config from a section of
// a larger file, without exporting it.
func RegisterSection[T any](load func(data []byte) (T, error)) {
	sections.Store(reflect.TypeFor[T](), load)
}

// LoadSection loads a T from a YAML section, as its package registered.
func LoadSection[T any](data []byte) (T, error) {
	f, ok := sections.Load(reflect.TypeFor[T]())
	if !ok {
		var zero T
		return zero, fmt.Errorf("config: no section loader for %s", reflect.TypeFor[T]())
	}
	return f.(func([]byte) (T, error))(data)
}
