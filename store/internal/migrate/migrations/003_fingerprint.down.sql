ALTER TABLE {schema}.{claims} DROP COLUMN IF EXISTS payload_hash;
