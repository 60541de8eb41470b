DROP TABLE IF EXISTS {schema}.{outbox};
