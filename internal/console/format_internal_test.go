package console

import (
	"testing"
	"time"
)

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		30 * 24 * time.Hour:          "30d",
		12 * time.Hour:               "12h",
		90 * time.Minute:             "1h30m",
		30 * time.Minute:             "30m",
		12*time.Hour + 5*time.Second: "12h0m5s",
		1500 * time.Millisecond:      "1.5s",
		36 * time.Hour:               "36h",
	} {
		if got := formatDuration(d); got != want {
			t.Errorf("formatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
