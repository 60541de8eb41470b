package kafka

// Names the black-box tests use. They are unexported in the package API:
// users write metadata names as strings in key specs.
const (
	MetadataTopic     = metadataTopic
	MetadataPartition = metadataPartition
	MetadataOffset    = metadataOffset
	MetadataKey       = metadataKey
	MetadataTimestamp = metadataTimestamp
	UUIDHeader        = uuidHeader
)

// Marshaler is the adapter's record converter.
type Marshaler = marshaler
