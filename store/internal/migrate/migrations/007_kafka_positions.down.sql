DROP TABLE IF EXISTS {schema}.kafka_positions;
