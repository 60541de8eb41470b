package configerror_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/claimtx/claimtx/brokers/internal/configerror"
	"github.com/claimtx/claimtx/framework"
)

func TestMatchesFrameworkConfigError(t *testing.T) {
	err := fmt.Errorf("start: %w", configerror.Prefix("kafka", &configerror.Error{Field: "brokers", Reason: "empty", Err: errors.New("amqp://u:secret@h")}))
	var fe *framework.ConfigError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "kafka.brokers", fe.Field)
	require.Equal(t, "empty", fe.Reason)
	require.NotContains(t, fe.Error(), "secret")
	var be *configerror.Error
	require.ErrorAs(t, err, &be)
	require.Equal(t, "brokers: config field \"kafka.brokers\": empty", be.Error())
	require.Equal(t, "x", configerror.New("x", "bad %d", 1).Field)
	plain := errors.New("other")
	require.Same(t, plain, configerror.Prefix("p", plain))
}
