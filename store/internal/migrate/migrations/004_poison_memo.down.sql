DROP TABLE IF EXISTS {schema}.{memo};
