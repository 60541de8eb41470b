package framework

import (
	"math/big"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The integer fast path must agree with the general rendering.
func TestCanonicalNumberFastPath(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		fast     bool
	}{
		{"0", "0", true},
		{"-0", "0", false},
		{"7", "7", true},
		{"-7", "-7", true},
		{"9912", "9912", true},
		{"123456789012345678901234567890", "123456789012345678901234567890", true},
		{"-123456789012345678901234567890", "-123456789012345678901234567890", true},
		{"007", "7", false},
		{"-007", "-7", false},
		{"7.0", "7", false},
		{"7e0", "7", false},
		{"-", "", false},
		{"1.", "", false},
		{".5", "", false},
		{"1e", "", false},
		{"1x", "", false},
	} {
		if got := plainInteger(tc.in); got != tc.fast {
			t.Errorf("plainInteger(%q) = %v, want %v", tc.in, got, tc.fast)
		}
		got, err := canonicalNumber(tc.in)
		if tc.want == "" {
			if err == nil {
				t.Errorf("canonicalNumber(%q) = %q, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("canonicalNumber(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// ratCanonical is the big.Rat rendering canonicalNumber replaced, kept as
// the oracle: keys already claimed were rendered by it, so the linear
// rendering must agree with it on every number, or those claims would stop
// matching their redeliveries.
func ratCanonical(s string) (string, bool) {
	var r big.Rat
	if _, ok := r.SetString(s); !ok {
		return "", false
	}
	if r.IsInt() {
		return r.Num().String(), true
	}
	for prec := 1; ; prec++ {
		out := r.FloatString(prec)
		var back big.Rat
		back.SetString(out)
		if back.Cmp(&r) == 0 {
			return out, true
		}
	}
}

func TestCanonicalNumberMatchesRat(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 5))
	digits := func(n int, leadZeroOK bool) string {
		var b strings.Builder
		for i := 0; i < n; i++ {
			c := byte('0' + rng.IntN(10))
			if rng.IntN(3) == 0 {
				c = '0' // zeros are where renderings differ
			}
			if i == 0 && !leadZeroOK && n > 1 && c == '0' {
				c = '1'
			}
			b.WriteByte(c)
		}
		return b.String()
	}
	for i := 0; i < 20000; i++ {
		var b strings.Builder
		if rng.IntN(2) == 0 {
			b.WriteByte('-')
		}
		b.WriteString(digits(1+rng.IntN(6), false))
		if rng.IntN(2) == 0 {
			b.WriteByte('.')
			b.WriteString(digits(1+rng.IntN(8), true))
		}
		if rng.IntN(2) == 0 {
			b.WriteString([]string{"e", "E", "e+", "e-", "E-"}[rng.IntN(5)])
			b.WriteString(digits(1+rng.IntN(3), true))
		}
		s := b.String()
		got, err := canonicalNumber(s)
		if i := strings.IndexAny(s, "eE"); i >= 0 {
			if e, _ := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+")); e > maxExponent || e < -maxExponent {
				if err == nil {
					t.Fatalf("canonicalNumber(%q) = %q, want an exponent error", s, got)
				}
				continue
			}
		}
		want, ok := ratCanonical(s)
		if !ok || err != nil || got != want {
			t.Fatalf("canonicalNumber(%q) = %q, %v; big.Rat says %q, %v", s, got, err, want, ok)
		}
	}
}

// jsonNumber is RFC 8259's number grammar: the only spellings the decoder
// hands to canonicalNumber.
var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

// FuzzCanonicalNumberOracle: on every JSON number (with a bounded exponent,
// so that the oracle stays fast) the linear rendering agrees with big.Rat.
func FuzzCanonicalNumberOracle(f *testing.F) {
	for _, s := range []string{"9912", "-0.50", "9.912e+03", "1E-40", "0.000100e2", "-0", "12.5e-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 64 || !jsonNumber.MatchString(s) {
			return
		}
		got, err := canonicalNumber(s)
		if i := strings.IndexAny(s, "eE"); i >= 0 {
			if e, aerr := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+")); aerr != nil || e > maxExponent || e < -maxExponent {
				if err == nil {
					t.Fatalf("canonicalNumber(%q) = %q, want an exponent error", s, got)
				}
				return
			}
		}
		want, _ := ratCanonical(s)
		if err != nil || got != want {
			t.Fatalf("canonicalNumber(%q) = %q, %v; big.Rat says %q", s, got, err, want)
		}
	})
}
