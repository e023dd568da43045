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

// colTypes are the columns' types, as reserveMany's arrays declare them.
var colTypes = map[string]string{
	"key": "text", "name": "text", "version": "smallint", "method": "text", "url": "text", "host": "text",
	"fingerprint": "bytea", "state": "smallint", "attempts": "bigint", "last_status": "integer", "last_error": "text",
	"created": "bigint", "updated": "bigint", "owner": "text", "lease_until": "bigint", "redacted": "boolean",
	"unreplayable": "boolean", "header": "bytea", "body": "bytea", "incarnation": "text", "reserve_id": "bigint",
	"key_header": "text", "trace": "text", "history": "jsonb",
}

// queries holds the store's SQL with its schema's table name filled in.
// Every statement is one round trip; those that change a row are one
// implicit transaction, so one commit.
type queries struct {
	reserve, reserveMany, finishMany, acquire, renew, leaseOf, get, attempt, finish, pending, claim, sweep, sweepWait, lastChange, barrier string
	now, policy, setPolicy, newer, releaseOwner, present                                                                                   string
}

// byIndex is the first statement of a transaction that runs a statement
// of many rows (reserveMany, finishMany): it has PostgreSQL plan them as
// one index lookup per row, whatever the table's size. They are prepared
// statements, so PostgreSQL plans them once per connection and keeps the
// plan; a plan made while the table was nearly empty joins the rows to a
// sequential scan of the table, and keeps doing so as the table grows (on
// this machine, a finish mark cost 97 µs that way, 31 µs written alone).
// The settings last for the transaction only.
const byIndex = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)`

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
	// reserveMany takes one array per column (colTypes): v is the rows
	// it unnests, in the order given (v.i).
	var arrays, vcols, vreturned, vins []string
	for i, c := range columns {
		arrays = append(arrays, "$"+strconv.Itoa(i+1)+"::"+colTypes[c]+"[]")
		vcols = append(vcols, c)
		switch c {
		case "header", "body":
			vreturned = append(vreturned, "NULL::bytea")
		default:
			vreturned = append(vreturned, "v."+c)
		}
		if c == "lease_until" {
			vins = append(vins, "CASE WHEN lease_until = 0 OR updated = 0 THEN lease_until ELSE "+dbNow+" + (lease_until - updated) END")
		} else {
			vins = append(vins, c)
		}
	}
	r := strings.NewReplacer("{now3}", dbNow, "{now5}", dbNow, "{now7}", dbNow, "{async}", async, "{maxHistory}", strconv.Itoa(idemstore.MaxHistory), "{ops}", ops, "{policy}", pgx.Identifier{schema, "policy"}.Sanitize(), "{cols}", cols, "{o.cols}", prefixed,
		"{returned}", strings.Join(returned, ", "), "{params}", strings.Join(params, ", "),
		"{arrays}", strings.Join(arrays, ", "), "{vcols}", strings.Join(vcols, ", "), "{v.returned}", strings.Join(vreturned, ", "), "{vins}", strings.Join(vins, ", "))
	return queries{
		// Reserve: insert, or return the row that has the name (first) or
		// the key, each looked up by its own index (a lookup of either
		// with OR is planned as a sequential scan on a small table, and
		// the plan is kept as the table grows: see byIndex). When the insert meets a row another transaction commits
		// after this statement's snapshot, neither branch returns a row, and
		// the caller runs the statement again.
		reserve: r.Replace(`WITH ins AS (
			INSERT INTO {ops} ({cols}) VALUES ({params})
			ON CONFLICT DO NOTHING
			RETURNING {returned}, true AS created
		)
		SELECT * FROM ins
		UNION ALL
		(SELECT {cols}, false FROM (
			SELECT {cols}, 0 AS pref FROM {ops} WHERE name = $2 AND NOT EXISTS (SELECT 1 FROM ins)
			UNION ALL
			SELECT {cols}, 1 FROM {ops} WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM ins)
		 ) c ORDER BY pref LIMIT 1)`),

		// reserveMany is reserve for several reservations in one
		// statement: $1…$24 are arrays, one per column, a reservation
		// per index. Each row returned starts with its reservation's
		// index in the arrays (from 1); a reservation with no row lost a
		// race (to a row committed after the snapshot, or to another
		// reservation of the same statement), and its caller runs reserve
		// alone. A reservation is created when the insert returned its
		// key with its reserve_id.
		reserveMany: r.Replace(`WITH v AS (
			SELECT * FROM unnest({arrays}) WITH ORDINALITY AS v({vcols}, i)
		), ins AS (
			INSERT INTO {ops} ({cols}) SELECT {vins} FROM v ORDER BY i
			ON CONFLICT DO NOTHING
			RETURNING key, reserve_id
		)
		SELECT v.i, {v.returned}, true FROM v JOIN ins ON ins.key = v.key COLLATE "C" AND ins.reserve_id = v.reserve_id
		UNION ALL
		SELECT v.i, o.*, false FROM v CROSS JOIN LATERAL (
			SELECT {cols} FROM {ops}
			WHERE name = v.name COLLATE "C" OR key = v.key COLLATE "C"
			ORDER BY (name = v.name COLLATE "C") IS TRUE DESC
			LIMIT 1) o
		WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.key = v.key COLLATE "C" AND ins.reserve_id = v.reserve_id)`),

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

		// finishMany is finish for several keys, each once, in one
		// statement: $1…$9 are arrays of finish's parameters, a mark per
		// index. It returns the keys it changed.
		finishMany: r.Replace(`{async} UPDATE {ops} o SET state = v.state, attempts = o.attempts + v.sent, last_status = v.status, last_error = v.err,
			updated = v.updated, header = NULL, body = NULL, lease_until = 0, url = v.url
		FROM unnest($1::text[], $2::smallint[], $3::bigint[], $4::integer[], $5::text[], $6::bigint[], $7::text[], $8::text[], $9::text[])
			AS v(key, state, sent, status, err, updated, url, owner, incarnation)
		WHERE o.key = v.key COLLATE "C" AND (v.owner = '' OR (o.state = 1 AND o.owner = v.owner COLLATE "C" AND o.incarnation = v.incarnation COLLATE "C")) AND (SELECT true FROM async)
		RETURNING o.key`),

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
		// (a row changed meanwhile is checked again once locked). Both
		// commit asynchronously ({async}): a chunk lost to a crash of the
		// server leaves rows the next Sweep deletes.
		sweep:     r.Replace(`{async} DELETE FROM {ops} WHERE key IN (SELECT key FROM {ops} WHERE state <> 1 AND updated < $1 LIMIT $2 FOR UPDATE SKIP LOCKED) AND (SELECT true FROM async)`),
		sweepWait: r.Replace(`{async} DELETE FROM {ops} WHERE key IN (SELECT key FROM {ops} WHERE state <> 1 AND updated < $1 LIMIT $2 FOR UPDATE) AND (SELECT true FROM async)`),

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
