//go:build !race

package amqp_test

const raceEnabled = false
