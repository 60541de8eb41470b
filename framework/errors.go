package framework

import (
	"errors"
	"fmt"
)

// ErrNoClaimTx is returned when a handler runs outside the claim middleware,
// with no transaction to write through: a wiring bug.
var ErrNoClaimTx = errors.New("claimtx: no claim transaction in context (handler not wrapped by the claim middleware)")

// permanent marks this package's errors that must not be retried; an
// interface so that typed errors stay matchable by their own type,
// unexported so that others mark errors with Permanent.
type permanent interface {
	permanent()
}

// PermanentError marks an error that retrying cannot fix (undecodable
// payload, business rule violation): it goes straight to the poison
// destination.
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

// Permanent wraps err so that IsPermanent reports true for it and every
// error wrapping it. Permanent(nil) is nil.
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

// KeyError explains why a message cannot be keyed: a missing field, a value
// of the wrong type, or a key KeyPolicy refuses. It is permanent.
type KeyError struct {
	// Source is where the key was looked for, e.g. `payload "order.id"`;
	// empty for validation of an already derived key.
	Source string
	Reason string
}

func (e *KeyError) Error() string {
	if e.Source == "" {
		return fmt.Sprintf("claimtx: invalid message key: %s", e.Reason)
	}
	return fmt.Sprintf("claimtx: invalid message key from %s: %s", e.Source, e.Reason)
}

func (e *KeyError) permanent() {}

// ConfigError names the configuration field that is wrong; constructors
// across claimtx return it instead of panicking.
type ConfigError struct {
	// Field is the name as the user wrote it ("Consumer", or the YAML/env
	// name where the value came from there).
	Field  string
	Reason string
	Err    error // underlying error, if any
}

func (e *ConfigError) Error() string {
	msg := fmt.Sprintf("claimtx: config field %q: %s", e.Field, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *ConfigError) Unwrap() error { return e.Err }

// PanicError is a handler panic as an error, so the transaction rolls back
// and the message is retried or poisoned instead of crashing the consumer.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("claimtx: handler panicked: %v", e.Value)
}

// AuthError reports that Dependency ("PostgreSQL", "RabbitMQ", "Kafka")
// refused the credentials (PostgreSQL 28P01/28000, RabbitMQ 403, Kafka
// SASL); start-up wraps one and does not retry it. Err is the dependency's
// own error, without the password.
type AuthError struct {
	Dependency string
	Err        error
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("claimtx: %s refused the credentials (authentication failed, not retried): %v", e.Dependency, e.Err)
}

func (e *AuthError) Unwrap() error { return e.Err }
