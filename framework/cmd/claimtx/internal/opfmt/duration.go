package opfmt

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/claimtx/claimtx/brokers"
	"github.com/claimtx/claimtx/framework/internal/replay"
)

const day = 24 * time.Hour

var daysPrefix = regexp.MustCompile(`^(\d+)d(.*)$`)

// ParseDuration accepts Go durations and a leading number of days: "30d", "36h",
// "1d12h".
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	var d time.Duration
	if m := daysPrefix.FindStringSubmatch(s); m != nil {
		days, err := strconv.Atoi(m[1])
		if err != nil || days > 100*365 {
			return 0, fmt.Errorf("%q: too many days", s)
		}
		d = time.Duration(days) * day
		if s = m[2]; s == "" {
			return d, nil
		}
	}
	rest, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (e.g. 30d, 36h, 1d12h)", s)
	}
	return d + rest, nil
}

// FormatDuration prints a retention or horizon: whole days as "30d", otherwise Go's
// form without its zero units ("12h", not "12h0m0s"), so ParseDuration reads it back.
func FormatDuration(d time.Duration) string {
	if d > 0 && d%day == 0 {
		return fmt.Sprintf("%dd", d/day)
	}
	out := d.String()
	if strings.HasSuffix(out, "m0s") {
		out = strings.TrimSuffix(out, "0s")
		if strings.HasSuffix(out, "h0m") {
			out = strings.TrimSuffix(out, "0m")
		}
	}
	return out
}

// Age prints how old something is, to two units: 3d4h, 5h2m, 4m5s, 40s.
func Age(a time.Duration) string {
	switch {
	case a < 0:
		return "0s"
	case a < time.Minute:
		return a.Round(time.Second).String()
	case a < time.Hour:
		return fmt.Sprintf("%dm%ds", int(a.Minutes()), int(a.Seconds())%60)
	case a < day:
		return fmt.Sprintf("%dh%dm", int(a.Hours()), int(a.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(a.Hours())/24, int(a.Hours())%24)
}

// FormatHorizon is a replay horizon as FormatDuration writes it ("1d", as
// the flags take it), or replay.Format's word for an unbounded one.
func FormatHorizon(d time.Duration) string {
	if d == brokers.UnboundedHorizon {
		return replay.Format(d)
	}
	return FormatDuration(d)
}
