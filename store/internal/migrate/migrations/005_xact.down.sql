ALTER TABLE {schema}.{outbox} DROP COLUMN IF EXISTS xact;
ALTER TABLE {schema}.{claims} DROP COLUMN IF EXISTS xact;
