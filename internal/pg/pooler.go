package pg

import "github.com/jackc/pgx/v5"

// PoolerReason is the configuration error's advice when pgx's statement
// cache meets a transaction pooler, whoever sees it first.
const PoolerReason = "reaches PostgreSQL through a transaction pooler (PgBouncer pool_mode=transaction?): " +
	"pgx's statement cache cannot work there: add default_query_exec_mode=exec to the URL"

// UnsafeBehindPooler reports whether pgx's query mode needs a statement to
// outlive its transaction on one server connection, which a transaction
// pooler does not give: CacheStatement keeps named prepared statements,
// DescribeExec binds in a second round trip that may reach another server.
// CacheDescribe is safe: it re-sends Parse and caches only the types.
func UnsafeBehindPooler(mode pgx.QueryExecMode) bool {
	return mode == pgx.QueryExecModeCacheStatement || mode == pgx.QueryExecModeDescribeExec
}

// IsPreparedStatementError reports whether err is the server refusing a
// named prepared statement it does not have (26000) or already has
// (42P05): pgx's statement cache behind a transaction pooler.
func IsPreparedStatementError(err error) bool {
	code := SQLState(err)
	return code == "26000" || code == "42P05"
}
