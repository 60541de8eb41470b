package config

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/claimtx/claimtx/framework"
)

// MaxConsumerBytes bounds consumer names; they are stored in every claim.
const MaxConsumerBytes = 200

// ValidateConsumer checks a consumer name from field; names are bound as
// SQL parameters, so this is about sane data, not injection.
func ValidateConsumer(field, consumer string) error {
	switch {
	case consumer == "":
		return &framework.ConfigError{Field: field, Reason: "must not be empty"}
	case len(consumer) > MaxConsumerBytes:
		return &framework.ConfigError{Field: field, Reason: fmt.Sprintf("is %d bytes, longer than %d", len(consumer), MaxConsumerBytes)}
	case !utf8.ValidString(consumer) || strings.IndexByte(consumer, 0) >= 0:
		return &framework.ConfigError{Field: field, Reason: "must be valid UTF-8 without NUL bytes"}
	}
	return nil
}
