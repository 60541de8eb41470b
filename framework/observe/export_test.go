package observe

// Exported for the black-box tests only.
var (
	Names   = names
	KeyHash = keyHash
)
