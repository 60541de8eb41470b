DROP TABLE IF EXISTS {schema}.{claims};
