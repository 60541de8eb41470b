DROP TABLE IF EXISTS {schema}.{dead_letter};
