DROP TABLE IF EXISTS {schema}.claimtx_lease;
