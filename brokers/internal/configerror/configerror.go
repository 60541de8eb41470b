// Package configerror holds the one error type every brokers package returns
// for a bad configuration, so callers match a single type with errors.As no
// matter which adapter produced it. brokers, brokers/amqp and brokers/kafka
// re-export it as ConfigError through a type alias.
package configerror

import (
	"errors"
	"fmt"

	"github.com/claimtx/claimtx/framework"
)

// Error reports a configuration field that cannot be used. Field is what
// the user set: the environment variable ("KAFKA_BROKERS") when the value
// came from one, otherwise the field's path as written in YAML
// ("kafka.brokers", "amqp.concurrency"). Reason says what is wrong with it. Neither ever contains a secret: reasons
// quote values only after redaction.
type Error struct {
	Field  string
	Reason string
	// Err is the underlying cause, if any (for example a parse error). It is
	// never printed by Error() when it could carry a secret; callers decide.
	Err error
}

func (e *Error) Error() string {
	if isEnvName(e.Field) {
		return fmt.Sprintf("brokers: environment variable %s: %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("brokers: config field %q: %s", e.Field, e.Reason)
}

// isEnvName tells an environment variable from a YAML path: YAML keys are
// lower case, the variables upper case, so the message can say which one
// the user has to change.
func isEnvName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if (r < 'A' || r > 'Z') && (r < '0' || r > '9') && r != '_' {
			return false
		}
	}
	return true
}

// Unwrap returns the underlying cause.
func (e *Error) Unwrap() error { return e.Err }

// As lets errors.As match *framework.ConfigError too, so callers of the
// composition root branch on one configuration error type whichever layer
// refused the value. The cause is not carried over: it may quote a secret.
func (e *Error) As(target any) bool {
	t, ok := target.(**framework.ConfigError)
	if !ok {
		return false
	}
	*t = &framework.ConfigError{Field: e.Field, Reason: e.Reason}
	return true
}

// New returns an *Error for field with a formatted reason.
func New(field, format string, args ...any) *Error {
	return &Error{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Prefix returns a copy of err whose Field is prefixed with prefix and a dot,
// so a sub-package's "brokers" becomes "kafka.brokers". Errors of other types
// are returned unchanged.
func Prefix(prefix string, err error) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	c := *e
	c.Field = prefix + "." + e.Field
	return &c
}
