package pgstore

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemgo/idem/idemstore"
)

// ErrPermission is returned when PostgreSQL refuses the store's role a
// privilege it needs (SQLSTATE 42501): creating the schema or its tables
// the first time, or reading and writing them later. At Open and New it
// is the error's only sentinel, so that it is not taken for a database
// that cannot be reached; from the KeyStore's methods it also matches
// idemstore.ErrJournalWrite, as the KeyStore contract asks (nothing is sent).
var ErrPermission = errors.New("pgstore: permission denied")

// ErrPooler is returned when the connection pooler between the store and
// PostgreSQL breaks prepared statements: PgBouncer (before 1.21, or with
// max_prepared_statements = 0) in transaction or statement pooling mode
// hands one client's prepared statements to another, so pgx's default
// query mode, which prepares and caches named statements, meets
// "prepared statement ... already exists" (SQLSTATE 42P05) or "does not
// exist" (26000). Open, New, OpenServerStore and NewServerStore probe for
// it and return it as the error's only sentinel; the stores' methods
// return it with idemstore.ErrJournalWrite. The cure is in the DSN:
// default_query_exec_mode=exec (or simple_protocol, or cache_describe),
// which prepare no named statement.
var ErrPooler = errors.New("pgstore: the connection pooler breaks prepared statements")

// poolerHint is what an error matching ErrPooler says to do.
const poolerHint = "behind PgBouncer in transaction pooling mode, add default_query_exec_mode=exec (or simple_protocol) to the DSN"

// pooler reports whether err is a prepared statement that a connection
// pooler lost or mixed up.
func pooler(err error) bool {
	switch sqlState(err) {
	case "42P05", "26000": // duplicate_prepared_statement, invalid_sql_statement_name
		return true
	}
	return false
}

// sqlState returns the SQLSTATE of a PostgreSQL error in err, or "".
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// permanent reports whether PostgreSQL refused a statement for its
// content (data exceptions, class 22, and integrity violations, class 23):
// sending it again cannot succeed.
func permanent(err error) bool {
	code := sqlState(err)
	return strings.HasPrefix(code, "22") || strings.HasPrefix(code, "23")
}

// maybeSent reports whether a statement that failed with err may have
// been carried out: the connection broke or the deadline passed after it
// was sent, so its commit and the loss of its answer may both have
// happened. An error PostgreSQL answered with (other than a fatal one,
// which may follow a commit) means it was not, and so does one pgx marks
// safe to retry (nothing was sent).
func maybeSent(err error) bool {
	var pe *pgconn.PgError
	switch {
	case err == nil:
		return false
	case errors.As(err, &pe):
		return pe.Severity == "FATAL" || pe.Severity == "PANIC"
	case pgconn.SafeToRetry(err):
		return false
	}
	var ce *pgconn.ConnectError
	return !errors.As(err, &ce)
}

// dbError wraps an error from PostgreSQL: the journal could not be
// reached or could not take the change. A permission error also matches
// ErrPermission. key may be "" (a call of no one record: pending, sweep).
func dbError(what, key string, err error) error {
	if key != "" {
		what += " " + key
	}
	if sqlState(err) == "42501" {
		return fmt.Errorf("pgstore: %s: %w: %w: %w", what, ErrPermission, idemstore.ErrJournalWrite, err)
	}
	if pooler(err) {
		return fmt.Errorf("pgstore: %s: %w (%s): %w: %w", what, ErrPooler, poolerHint, idemstore.ErrJournalWrite, err)
	}
	return fmt.Errorf("pgstore: %s: %w: %w", what, idemstore.ErrJournalWrite, err)
}

// unknownError wraps the error of a change whose answer was lost.
func unknownError(what, key string, err error) error {
	return fmt.Errorf("pgstore: %s %s: the change may be committed: %w: %w", what, key, idemstore.ErrOutcomeUnknown, err)
}
