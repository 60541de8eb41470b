// Package dlq browses, classifies and replays a consumer's poison
// destination (its dead letters): the machinery of `claimtx dlq`, kept
// here so the web console can reuse it.
//
// # Browsing without consuming
//
// Open returns a Source over the destination as it was when opened; Next
// hands out its messages in destination order. Browsing takes nothing
// away:
//
//   - RabbitMQ (a queue): basic.get without ack, one message at a time, on a
//     channel of its own. The messages stay unacked on that channel, so no
//     other consumer gets them while the browse runs, and Close closes the
//     channel: RabbitMQ requeues every message that was not removed, in its
//     original position (RabbitMQ returns requeued messages to their place in
//     the queue), flagged redelivered. A killed process does the same: the
//     connection dies, the channel with it. The browse stops at the number of
//     ready messages counted when it opened, so messages poisoned meanwhile
//     are left for the next run. Caveat: a queue with a delivery limit
//     (quorum queue x-delivery-limit) may count such a requeue as a delivery;
//     do not give poison queues a delivery limit.
//   - Kafka (a topic): a franz-go client outside any consumer group reads
//     every partition from its start offset (the earliest retained, or for a
//     replay the progress recorded by the previous one, below) to the end
//     offset seen when it opened. Nothing is committed by browsing.
//   - NATS (a subject in a JetStream stream): JetStream's get-message API,
//     by sequence, filtered by the poison subject, from the stream's first
//     sequence to the last one seen when it opened. Unlike a consumer, even
//     an ephemeral one that acks nothing, it delivers nothing and leaves no
//     state on the server, so a killed browse needs no clean-up and cannot
//     count as a delivery anywhere. Another browse may read the same
//     messages meanwhile (JetStream has no unacked hold as RabbitMQ does):
//     two replays at once may republish a message twice, a duplicate for
//     its claim.
//
// # Classification
//
// A Classifier re-derives each message's key with today's key spec and
// looks the claim up in the claims table: ClassApplied (a claim exists;
// with its payload fingerprint equal, different — a producer or
// key-derivation bug — or not recorded), ClassWouldApply (no claim),
// ClassStillBad (today's spec cannot key it), ClassMemo (a poison memo
// exists; see Memo, wired when the poison memo lands).
//
// # Replay
//
// Replay republishes the selected messages to the topic they were consumed
// from, keeping their identity (payload, every metadata entry and
// broker property the copy carries: event id, key fields, event time,
// traceparent, the Watermill UUID, the Kafka record key and timestamp),
// minus the poison bookkeeping (poison.IsPoisonKey), and removes each
// from the destination only after the broker confirmed the republish:
//
//   - RabbitMQ: publisher confirms on a confirm-mode channel; a message is
//     acked on the browsing channel (which removes it from the poison
//     queue) only once RabbitMQ confirmed its copy.
//   - Kafka: records are produced with acks from all in-sync replicas. A
//     topic cannot delete single records, so the replay records its
//     progress instead: after each confirmed batch it commits, for the
//     consumer group claimtx-dlq-<consumer>, the offset up to which every
//     message was republished or passed over for good (already applied,
//     another consumer's or another topic's copy). The first message it
//     leaves for later (still bad, filtered out, past --limit) stops the
//     progress of its partition, so a later run with other filters or a
//     fixed key spec sees it again. The next replay starts at the committed
//     offsets; FromStart ignores them.
//   - NATS: the copy is published with JetStream's acknowledgement
//     awaited, and the letter's sequence is deleted from the poison stream
//     only once the stream stored the copy. A copy the stream drops as a
//     duplicate (a Nats-Msg-Id seen within its duplicate window) is
//     reported and its letter kept.
//
// Killed at any point, nothing is lost: every message is still in the
// destination, republished, or both; a message that is both is a
// duplicate for its claim when the consumer sees it again.
package dlq
