package kafka

// Marshaler is the adapter's record converter.
type Marshaler = marshaler
