package framework

import (
	"errors"
	"fmt"
)

// ErrNoClaimTx is returned by TxFromContext users (and the typed handler
// adapter) when a handler runs outside the claim middleware, so it has no
// transaction to write through. It is permanent: it is a wiring bug.
var ErrNoClaimTx = errors.New("claimtx: no claim transaction in context (handler not wrapped by the claim middleware)")

// permanent is implemented by this package's errors that must not be
// retried (*PermanentError, *KeyError, *EventTimeError, *ExpiredError). It
// is an interface rather than one concrete type so that typed errors can be
// permanent and still be matched by their own type; the method is
// unexported because the set is closed: others mark errors with Permanent.
type permanent interface {
	permanent()
}

// PermanentError marks an error that retrying cannot fix (undecodable payload,
// business rule violation). The claim middleware does not retry it and the
// composed router routes it straight to the poison destination.
type PermanentError struct {
	Err error
}

func (e *PermanentError) Error() string {
	if e.Err == nil {
		return "claimtx: permanent error"
	}
	return e.Err.Error()
}

func (e *PermanentError) Unwrap() error { return e.Err }

func (e *PermanentError) permanent() {}

// Permanent wraps err so that IsPermanent reports true for it and for every
// error that wraps it. Permanent(nil) returns nil so it can wrap a call's
// result directly.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	if IsPermanent(err) {
		return err
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err, or any error it wraps, was marked
// permanent.
func IsPermanent(err error) bool {
	var p permanent
	return errors.As(err, &p)
}

// KeyError explains why a message cannot be keyed: a missing field, a
// value of the wrong type, or a key that fails validation (empty, not
// UTF-8, contains NUL, too long). It is permanent: redelivering the same
// message cannot fix it. Branch on it with errors.As.
type KeyError struct {
	// Source names where the key was looked for, e.g. `metadata "event_id"`
	// or `payload "order.id"`; empty for validation of an already derived key.
	Source string
	// Reason is a short, human-readable explanation.
	Reason string
}

func (e *KeyError) Error() string {
	if e.Source == "" {
		return fmt.Sprintf("claimtx: invalid message key: %s", e.Reason)
	}
	return fmt.Sprintf("claimtx: invalid message key from %s: %s", e.Source, e.Reason)
}

func (e *KeyError) permanent() {}

// ConfigError names the configuration field that is wrong. Constructors and
// Validate methods across claimtx return it instead of panicking.
type ConfigError struct {
	// Field is the field's name as the user wrote it, e.g. "Consumer" or
	// "key" (YAML/env names are used where the value came from there).
	Field string
	// Reason says what is wrong with it.
	Reason string
	// Err is an underlying error, if any.
	Err error
}

func (e *ConfigError) Error() string {
	msg := fmt.Sprintf("claimtx: config field %q: %s", e.Field, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *ConfigError) Unwrap() error { return e.Err }

// PanicError carries a handler panic converted to an error, so the claim
// transaction can roll back and the message can be retried or poisoned like
// any other failure instead of crashing the consumer.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("claimtx: handler panicked: %v", e.Value)
}

// AuthError reports that Dependency ("PostgreSQL", "RabbitMQ", "Kafka")
// refused the credentials: PostgreSQL 28P01/28000, RabbitMQ 403
// ACCESS_REFUSED, a Kafka SASL authentication failure. Every start-up error
// that means this wraps one (branch with errors.As). Waiting cannot fix
// it, so start-up does not retry it. Err is the dependency's own error; no
// layer puts a password into it.
type AuthError struct {
	Dependency string
	Err        error
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("claimtx: %s refused the credentials (authentication failed, not retried): %v", e.Dependency, e.Err)
}

func (e *AuthError) Unwrap() error { return e.Err }
