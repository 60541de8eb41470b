package framework

import (
	"errors"
	"fmt"
)

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrInvalidKey is matched by every error that means "this message cannot be
	// keyed": a missing field, a value of the wrong type, or a key that fails
	// validation (empty, not UTF-8, contains NUL, too long). Such errors are
	// permanent: redelivering the same message cannot fix them.
	ErrInvalidKey = errors.New("claimtx: invalid message key")

	// ErrNoClaimTx is returned by TxFromContext users (and the typed handler
	// adapter) when a handler runs outside the claim middleware, so it has no
	// transaction to write through. It is permanent: it is a wiring bug.
	ErrNoClaimTx = errors.New("claimtx: no claim transaction in context (handler not wrapped by the claim middleware)")
)

// permanent is implemented by errors that must not be retried. It is an
// interface rather than one concrete type so that typed errors such as
// *KeyError can be permanent and still be matched by their own type.
type permanent interface {
	Permanent() bool
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

// Permanent reports true.
func (e *PermanentError) Permanent() bool { return true }

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
	return errors.As(err, &p) && p.Permanent()
}

// KeyError explains why a message could not be keyed. It matches
// ErrInvalidKey and is permanent.
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

// Is lets errors.Is(err, ErrInvalidKey) match.
func (e *KeyError) Is(target error) bool { return target == ErrInvalidKey }

// Permanent reports true: the same message yields the same key error.
func (e *KeyError) Permanent() bool { return true }

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

// ErrAuthentication is matched (errors.Is) by every start-up error that
// means a dependency refused the credentials: PostgreSQL 28P01/28000,
// RabbitMQ 403 ACCESS_REFUSED, a Kafka SASL authentication failure.
// Waiting cannot fix such an error, so start-up does not retry it.
var ErrAuthentication = errors.New("claimtx: authentication failed")

// AuthError reports that Dependency ("PostgreSQL", "RabbitMQ", "Kafka")
// refused the credentials. It matches ErrAuthentication. Err is the
// dependency's own error; no layer puts a password into it.
type AuthError struct {
	Dependency string
	Err        error
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("claimtx: %s refused the credentials (authentication failed, not retried): %v", e.Dependency, e.Err)
}

func (e *AuthError) Unwrap() error { return e.Err }

// Is reports whether target is ErrAuthentication.
func (e *AuthError) Is(target error) bool { return target == ErrAuthentication }
