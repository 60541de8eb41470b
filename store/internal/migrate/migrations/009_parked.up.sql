-- Ordered effects (middleware.Claim.OrderKey): a message of an order key
-- that failed for good is parked here instead of poisoned, and every later
-- message of that key is parked behind it, in delivery order, until an
-- operator releases the key (`claimtx parked retry|skip`) or an automatic
-- retry applies them.
--
-- parked_keys has one row per parked (consumer, order_key): it exists while
-- any message of the key is parked, and it is the key's lock. A claim
-- transaction reads it FOR SHARE before its claim, a release holds it FOR
-- UPDATE, so a message arriving during a release waits for it and then
-- either parks behind what is left or, once the key is released, applies.
-- reason is why the head (the oldest parked message) last failed; retry_at
-- is when a release is due (NULL: only when an operator asks); skip_head
-- asks the release to poison the head first; requested_by/request_note say
-- who asked for the pending release and why.
CREATE TABLE IF NOT EXISTS {schema}.{parked_keys} (
    consumer     text        NOT NULL,
    order_key    text        NOT NULL,
    reason       text        NOT NULL,
    parked_at    timestamptz NOT NULL DEFAULT now(),
    failures     integer     NOT NULL DEFAULT 1,
    retry_at     timestamptz,
    skip_head    boolean     NOT NULL DEFAULT false,
    requested_by text,
    request_note text,
    PRIMARY KEY (consumer, order_key)
);

-- The releases due, found by the consumers' releasers.
CREATE INDEX IF NOT EXISTS {parked_keys_retry_idx} ON {schema}.{parked_keys} (consumer, retry_at) WHERE retry_at IS NOT NULL;

-- The parked messages: id is the parking order, which is the delivery
-- order of the key's messages. message_key is the dedup key: a copy of a
-- parked message is not parked twice. payload and metadata are the
-- message's own (metadata as a JSON object of strings); reason is set on
-- the message that failed, NULL on those parked behind it. Claim retention
-- never deletes these rows: a release or `claimtx parked skip` does.
CREATE TABLE IF NOT EXISTS {schema}.{parked} (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer    text        NOT NULL,
    order_key   text        NOT NULL,
    message_key text        NOT NULL,
    uuid        text        NOT NULL,
    payload     bytea       NOT NULL,
    metadata    jsonb       NOT NULL DEFAULT '{}',
    reason      text,
    parked_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (consumer, message_key)
);

CREATE INDEX IF NOT EXISTS {parked_order_idx} ON {schema}.{parked} (consumer, order_key, id);
