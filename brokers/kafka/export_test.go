package kafka

// Marshaler is the publisher's record converter.
type Marshaler = marshaler

// UnmarshalRecord is the subscriber's record converter.
var UnmarshalRecord = unmarshalRecord

// Subscriber and Publisher are what NewSubscriber and NewPublisher return.
type (
	Subscriber = subscriber
	Publisher  = publisher
)
