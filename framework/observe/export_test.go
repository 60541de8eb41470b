package observe

import "github.com/claimtx/claimtx/framework/internal/metrics"

// Exported for the black-box tests only.
var (
	Names   = metrics.Names
	KeyHash = keyHash
)
