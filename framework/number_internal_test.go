package framework

import "testing"

// The integer fast path must agree with big.Rat's rendering.
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
