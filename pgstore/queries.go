package pgstore

import (
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/idemstore"
)

// columns are an operation row's columns in the order scanRow reads them.
var columns = []string{
	"key", "name", "version", "method", "url", "host", "fingerprint", "state",
	"attempts", "last_status", "last_error", "created", "updated", "owner",
	"lease_until", "redacted", "unreplayable", "header", "body", "incarnation", "reserve_id", "key_header",
	"trace", "history",
}

// queries holds the store's SQL with its schema's table name filled in.
// Every statement is one round trip; those that change a row are one
// implicit transaction, so one commit.
type queries struct {
	reserve, acquire, renew, leaseOf, get, attempt, finish, pending, claim, sweep, sweepWait, lastChange, barrier string
	now, policy, setPolicy, newer, releaseOwner, present                                                          string
}

// dbNow is the database's clock in Unix nanoseconds (to the microsecond).
const dbNow = `((extract(epoch FROM clock_timestamp()) * 1000000)::bigint * 1000)`

// newQueries returns the store's SQL for schema. Leases are judged by the
// database's clock: a lease change is "now" when the statement runs,
// whatever time its caller passed, and a lease lasts Until − At from then.
// (The tests that need synthetic times set the database's clock instead:
// clockedStore, in doubles_test.go.)
func newQueries(schema string) queries {
	ops := pgx.Identifier{schema, "operations"}.Sanitize()
	cols := strings.Join(columns, ", ")
	prefixed := "o." + strings.Join(columns, ", o.")
	// The created row comes back without its header and body (the caller
	// has them), so a large body is not sent back over the wire.
	var returned []string
	for _, c := range columns {
		switch c {
		case "header", "body":
			returned = append(returned, "NULL::bytea")
		default:
			returned = append(returned, c)
		}
	}
	params := make([]string, len(columns))
	for i, c := range columns {
		params[i] = "$" + strconv.Itoa(i+1)
		if c == "lease_until" { // as long from now as from the record's Updated ($13), when it has one
			params[i] = "CASE WHEN " + params[i] + "::bigint = 0 OR $13::bigint = 0 THEN " + params[i] + "::bigint ELSE " +
				dbNow + " + (" + params[i] + "::bigint - $13::bigint) END"
		}
	}
	// $1 is the key and $2 the name (NULL when unnamed), as in columns.
	// {async} makes a mark's commit asynchronous: PostgreSQL answers
	// before the WAL is flushed, which the next synchronous commit (a
	// Reserve, or Close's barrier) or the WAL writer does within a few
	// hundred milliseconds. Only a crash of the server itself in that window
	// loses the mark (see the package documentation).
	async := `WITH async AS (SELECT set_config('synchronous_commit', 'off', true))`
	r := strings.NewReplacer("{now3}", dbNow, "{now5}", dbNow, "{now7}", dbNow, "{async}", async, "{maxHistory}", strconv.Itoa(idemstore.MaxHistory), "{ops}", ops, "{policy}", pgx.Identifier{schema, "policy"}.Sanitize(), "{cols}", cols, "{o.cols}", prefixed,
		"{returned}", strings.Join(returned, ", "), "{params}", strings.Join(params, ", "))
	return queries{
		// Reserve: insert, or return the row that has the name (first) or
		// the key. When the insert meets a row another transaction commits
		// after this statement's snapshot, neither branch returns a row, and
		// the caller runs the statement again.
		reserve: r.Replace(`WITH ins AS (
			INSERT INTO {ops} ({cols}) VALUES ({params})
			ON CONFLICT DO NOTHING
			RETURNING {returned}, true AS created
		)
		SELECT * FROM ins
		UNION ALL
		(SELECT {cols}, false FROM {ops}
		 WHERE NOT EXISTS (SELECT 1 FROM ins) AND (name = $2 OR key = $1)
		 ORDER BY (name = $2) IS TRUE DESC
		 LIMIT 1)`),

		// Acquire: $2 owner, $3 lease until, $4 updated, $5 header, $6
		// body, $7 lease at, $8 incarnation, $9 URL. A finished row becomes
		// pending with the given request; a row under another holder's live lease
		// (another owner, or the same owner name in another incarnation)
		// is left alone.
		acquire: r.Replace(`UPDATE {ops} SET
			owner = $2, lease_until = {now7} + ($3::bigint - $7::bigint), updated = $4, incarnation = $8,
			url = CASE WHEN state = 1 THEN url ELSE $9 END,
			header = CASE WHEN state = 1 THEN header ELSE $5 END,
			body = CASE WHEN state = 1 THEN body ELSE $6 END,
			state = 1
		WHERE key = $1 AND NOT (state = 1 AND owner <> '' AND NOT (owner = $2 AND incarnation = $8) AND lease_until > {now7})
		RETURNING {cols}`),

		// Renew: $2 owner, $3 lease until, $4 incarnation, $5 the lease's
		// At. Only the holder may renew, and only while the row is
		// pending. Leases do not count as changes of the record: Updated
		// stays (Resume reads it as the record's age).
		renew: r.Replace(`UPDATE {ops} SET lease_until = {now5} + ($3::bigint - $5::bigint) WHERE key = $1 AND state = 1 AND owner = $2 AND incarnation = $4`),

		// leaseOf explains why Acquire or Renew changed nothing.
		leaseOf: r.Replace(`SELECT state, owner, lease_until, incarnation FROM {ops} WHERE key = $1`),

		get: r.Replace(`SELECT {cols} FROM {ops} WHERE key = $1`),

		// Attempt: $2 sent, $3 status, $4 error, $5 updated, $6 the
		// attempt as a history entry (JSON), which the statement appends
		// to the history, keeping the newest {maxHistory}; $7 the mark's
		// owner and $8 this store's incarnation: only a pending row this
		// store holds under that owner changes ($7 '': any row, as the
		// marks of tools and tests).
		attempt: r.Replace(`{async} UPDATE {ops} SET attempts = attempts + $2, last_status = $3, last_error = $4, updated = $5,
			history = (SELECT jsonb_agg(e ORDER BY i) FROM (
				SELECT e, i FROM jsonb_array_elements(coalesce(history, '[]'::jsonb) || jsonb_build_array($6::jsonb)) WITH ORDINALITY AS h(e, i)
				ORDER BY i DESC LIMIT {maxHistory}) AS kept)
		WHERE key = $1 AND ($7::text = '' OR (state = 1 AND owner = $7::text AND incarnation = $8::text)) AND (SELECT true FROM async)`),

		// Finish: $2 state, $3 sent, $4 status, $5 error, $6 updated, $7
		// the URL the finished record keeps (the journal's). The
		// replayable request goes; the lease ends. $8 owner and $9
		// incarnation fence it as Attempt's $7 and $8.
		finish: r.Replace(`{async} UPDATE {ops} SET state = $2, attempts = attempts + $3, last_status = $4, last_error = $5,
			updated = $6, header = NULL, body = NULL, lease_until = 0, url = $7
		WHERE key = $1 AND ($8::text = '' OR (state = 1 AND owner = $8::text AND incarnation = $9::text)) AND (SELECT true FROM async)`),

		// present: which of the keys $1 have a row; it tells a mark that
		// changed nothing because its owner lost the row from one whose
		// row is gone.
		present: r.Replace(`SELECT key FROM {ops} WHERE key = ANY($1::text[])`),

		// Pending: $1 after, $2 limit (NULL: no limit).
		pending: r.Replace(`SELECT {cols} FROM {ops} WHERE state = 1 AND key > $1 ORDER BY key LIMIT $2`),

		// Claim: $1 after, $2 owner, $3 lease at, $4 limit, $5 lease until,
		// $6 incarnation, $7 the newest record version this package reads
		// (newer rows are left to newer replicas). It takes rows no one
		// holds, rows whose lease lapsed, and rows this very store holds;
		// never a live lease of the same owner name in another
		// incarnation (a restarted process, or a zombie still running).
		// Updated stays, as in Renew. Rows another Claim has locked are
		// skipped, not waited for; rows it has just leased fail the lease
		// test when rechecked.
		claim: r.Replace(`WITH c AS (
			SELECT key FROM {ops}
			WHERE state = 1 AND key > $1 AND (owner = '' OR lease_until <= {now3} OR (owner = $2 AND incarnation = $6))
			AND version <= $7
			ORDER BY key LIMIT $4
			FOR UPDATE SKIP LOCKED
		)
		UPDATE {ops} o SET owner = $2, lease_until = {now3} + ($5::bigint - $3::bigint), incarnation = $6
		FROM c WHERE o.key = c.key
		RETURNING {o.cols}`),

		// Sweep: $1 cutoff, $2 how many rows at most. Rows another
		// transaction holds (another replica's Sweep, idem gc) are
		// skipped, not waited for, so overlapping sweeps delete disjoint
		// rows; sweepWait, the same without SKIP LOCKED, is the last pass:
		// it waits for the rows others hold and deletes those they left
		// (a row changed meanwhile is checked again once locked).
		sweep:     r.Replace(`DELETE FROM {ops} WHERE key IN (SELECT key FROM {ops} WHERE state <> 1 AND updated < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)`),
		sweepWait: r.Replace(`DELETE FROM {ops} WHERE key IN (SELECT key FROM {ops} WHERE state <> 1 AND updated < $1 LIMIT $2 FOR UPDATE)`),

		// lastChange: the finished rows' latest through their index on
		// updated, the pending ones (few) by a scan of theirs.
		lastChange: r.Replace(`SELECT coalesce(greatest(
			(SELECT max(updated) FROM {ops} WHERE state <> 1),
			(SELECT max(updated) FROM {ops} WHERE state = 1)), 0)`),

		// barrier commits a transaction that has an id, so its commit
		// flushes the WAL (synchronous_commit on), and with it every
		// asynchronous commit before it.
		barrier: `SELECT pg_current_xact_id()::text`,

		// releaseOwner: $1 owner, $2 this store's incarnation.
		releaseOwner: r.Replace(`UPDATE {ops} SET lease_until = 0 WHERE state = 1 AND owner = $1 AND incarnation <> $2`),

		// newer counts the pending rows of a format newer than $1.
		newer: r.Replace(`SELECT count(*) FROM {ops} WHERE state = 1 AND version > $1`),

		// now is the database's clock in Unix microseconds (its
		// resolution): the time of the call, not of its transaction.
		now: `SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint`,

		policy: r.Replace(`SELECT key_header, resend_window, retention, match_window FROM {policy}`),
		setPolicy: r.Replace(`INSERT INTO {policy} (key_header, resend_window, retention, match_window) VALUES ($1, $2, $3, $4)
		ON CONFLICT (id) DO UPDATE SET key_header = $1, resend_window = $2, retention = $3, match_window = $4`),
	}
}
