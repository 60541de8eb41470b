package poisonsql_test

import (
	"testing"

	"github.com/claimtx/claimtx/internal/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyTestMain(m) }
