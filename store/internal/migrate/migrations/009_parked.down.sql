DROP TABLE IF EXISTS {schema}.{parked};
DROP TABLE IF EXISTS {schema}.{parked_keys};
