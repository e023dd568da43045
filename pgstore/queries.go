package pgstore

import "github.com/jackc/pgx/v5"

// queries holds the store's SQL with its schema's table names filled in.
type queries struct {
	ops string // the operations table, schema-qualified and quoted
}

func newQueries(schema string) queries {
	return queries{ops: pgx.Identifier{schema, "operations"}.Sanitize()}
}
