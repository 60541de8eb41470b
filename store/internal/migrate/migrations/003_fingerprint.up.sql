-- Optional fingerprint of the payload that made the claim, so a duplicate
-- whose payload differs (same key, different content: a producer or key
-- derivation bug) can be detected and counted. NULL when not recorded.
ALTER TABLE {schema}.{claims} ADD COLUMN IF NOT EXISTS payload_hash bytea;
