// Package defaults lets an adapter apply the defaults of its section of
// brokers.Config (brokers.AMQPConfig, brokers.KafkaConfig), which package
// brokers owns, without brokers exporting a function for it: brokers
// registers each section's unexported withDefaults here from an init
// function.
package defaults

import (
	"reflect"
	"sync"
)

var fillers sync.Map // reflect.Type of T -> func(T) T

// Register records fill as the function that applies T's defaults.
func Register[T any](fill func(T) T) {
	fillers.Store(reflect.TypeFor[T](), fill)
}

// Apply returns v with T's defaults applied, or v itself when no adapter
// registered defaults for T.
func Apply[T any](v T) T {
	f, ok := fillers.Load(reflect.TypeFor[T]())
	if !ok {
		return v
	}
	return f.(func(T) T)(v)
}
