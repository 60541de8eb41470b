package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/framework"
	"github.com/claimtx/claimtx/internal/config"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"", "a\x00", string([]byte{0xff}), strings.Repeat("a", config.MaxConsumerBytes+1)} {
		err := config.ValidateConsumer("Name", c)
		var ce *framework.ConfigError
		require.True(t, errors.As(err, &ce), "%q: %v", c, err)
		require.Equal(t, "Name", ce.Field)
	}
	require.NoError(t, config.ValidateConsumer("Consumer", strings.Repeat("a", config.MaxConsumerBytes)))
	require.NoError(t, config.ValidateConsumer("Consumer", "loyalty; DROP TABLE x"), "consumer names are bound parameters, any text is safe")
}
