package opfmt_test

import (
	"testing"
	"time"

	"github.com/claimtx/claimtx/framework/cmd/claimtx/internal/opfmt"
)

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		30 * 24 * time.Hour:          "30d",
		12 * time.Hour:               "12h",
		36 * time.Hour:               "36h",
		90 * time.Minute:             "1h30m",
		30 * time.Minute:             "30m",
		12*time.Hour + 5*time.Second: "12h0m5s",
		1500 * time.Millisecond:      "1.5s",
	} {
		if got := opfmt.FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
		if back, err := opfmt.ParseDuration(opfmt.FormatDuration(d)); err != nil || back != d {
			t.Errorf("ParseDuration(FormatDuration(%v)) = %v, %v", d, back, err)
		}
	}
}

func TestParseDuration(t *testing.T) {
	good := map[string]time.Duration{"30d": 30 * 24 * time.Hour, "1d12h": 36 * time.Hour, " 90m ": 90 * time.Minute, "0s": 0,
		"36h": 36 * time.Hour, "90m": 90 * time.Minute, " 7d ": 7 * 24 * time.Hour}
	for s, want := range good {
		if got, err := opfmt.ParseDuration(s); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "d", "3 days", "30 days", "1dd", "99999999d", "-3d", "1d-"} {
		if _, err := opfmt.ParseDuration(s); err == nil {
			t.Errorf("ParseDuration(%q): want an error", s)
		}
	}
}

func TestAge(t *testing.T) {
	for a, want := range map[time.Duration]string{
		-time.Second: "0s", 40 * time.Second: "40s", 245 * time.Second: "4m5s",
		5*time.Hour + 2*time.Minute: "5h2m", 76 * time.Hour: "3d4h",
	} {
		if got := opfmt.Age(a); got != want {
			t.Errorf("Age(%v) = %q, want %q", a, got, want)
		}
	}
}
