//go:build race

package main

// raceEnabled: the test was built with -race, so the program is too.
const raceEnabled = true
