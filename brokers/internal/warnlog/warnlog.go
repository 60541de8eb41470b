// Package warnlog logs at WARN through a watermill.LoggerAdapter, which has
// no warning level of its own: a logger with a Warn method (the one
// framework/consumer passes) gets the message at WARN, any other at INFO.
package warnlog

import "github.com/ThreeDotsLabs/watermill"

// Log logs msg at WARN when logger can, at INFO otherwise.
func Log(logger watermill.LoggerAdapter, msg string, fields watermill.LogFields) {
	if w, ok := logger.(interface {
		Warn(msg string, fields watermill.LogFields)
	}); ok {
		w.Warn(msg, fields)
		return
	}
	logger.Info(msg, fields)
}
