package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/idemstore"
)

var _ idemstore.KeyStore = (*Store)(nil)

// recordVersion is the row format this package writes and reads.
const recordVersion = 1

// reserveTries bounds how often Reserve runs its statement again after
// racing with another replica's insert of the same name or key; each retry
// sees the row the race was lost to, so two suffice.
const reserveTries = 4

// check returns an error if ctx is done or the store is closed.
func (s *Store) check(ctx context.Context) error {
	if s.closed.Load() {
		return idemstore.ErrClosed
	}
	return ctx.Err()
}

// ready is check for every method but Attempt and Finish: it also waits,
// within ctx, for the accepted marks still waiting to be written, so that
// reads see them and later changes apply after them. When they cannot be
// written in time, neither can this call's change: it fails with
// idemstore.ErrJournalWrite.
func (s *Store) ready(ctx context.Context) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.marks.ready(ctx)
}

// callTimeout bounds a call whose context has no earlier deadline.
const callTimeout = 30 * time.Second

// bind returns ctx, also cancelled when Close gives up on PostgreSQL, and
// with a deadline bound from now unless ctx ends sooner (bound 0:
// callTimeout). Every statement runs under such a context, so no call
// outlives its bound or Close's, whatever the context it was given.
func (s *Store) bind(ctx context.Context, bound time.Duration) (context.Context, context.CancelFunc) {
	if bound <= 0 {
		bound = callTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	stop := context.AfterFunc(s.base, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// nanos and fromNanos convert times to the Unix nanoseconds of a row, 0
// meaning unset, so a time reads back exactly as written.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func nullName(name string) any {
	if name == "" {
		return nil
	}
	return name
}

// rawHeader marks a header column written as JSON of base64 values
// (map[string][][]byte), for headers with values that are not UTF-8
// (obs-text), which JSON strings would turn into U+FFFD. Other headers are
// JSON of http.Header, whose first byte is '{'.
const rawHeader = 'b'

func encodeHeader(h http.Header) ([]byte, error) {
	if h == nil {
		return nil, nil
	}
	for _, vs := range h {
		for _, v := range vs {
			if !utf8.ValidString(v) {
				raw := make(map[string][][]byte, len(h))
				for k, vs := range h {
					for _, v := range vs {
						raw[k] = append(raw[k], []byte(v))
					}
				}
				b, err := json.Marshal(raw)
				return append([]byte{rawHeader}, b...), err
			}
		}
	}
	return json.Marshal(h)
}

// decodeHeader reads what encodeHeader wrote.
func decodeHeader(b []byte) (http.Header, error) {
	if len(b) == 0 || b[0] != rawHeader {
		var h http.Header
		return h, json.Unmarshal(b, &h)
	}
	var raw map[string][][]byte
	if err := json.Unmarshal(b[1:], &raw); err != nil || raw == nil {
		return nil, fmt.Errorf("header: %v", err)
	}
	h := make(http.Header, len(raw))
	for k, vs := range raw {
		for _, v := range vs {
			h[k] = append(h[k], string(v))
		}
	}
	return h, nil
}

// row is an operations row as scanned, before it is checked.
type row struct {
	key, method, url, host, lastError, owner string
	name                                     *string
	version, state                           int16
	fingerprint, header, body                []byte
	attempts                                 int64
	lastStatus                               int32
	created, updated, leaseUntil             int64
	redacted, unreplayable                   bool
	incarnation                              string
	reserveID                                int64
	keyHeader, trace                         string
	history                                  []byte
}

func (r *row) dest() []any {
	return []any{&r.key, &r.name, &r.version, &r.method, &r.url, &r.host, &r.fingerprint, &r.state,
		&r.attempts, &r.lastStatus, &r.lastError, &r.created, &r.updated, &r.owner,
		&r.leaseUntil, &r.redacted, &r.unreplayable, &r.header, &r.body, &r.incarnation, &r.reserveID, &r.keyHeader,
		&r.trace, &r.history}
}

// operation checks the row and returns it as an Operation. A row it cannot
// read is an error matching idemstore.ErrRecordVersion (a newer format) or
// idemstore.ErrJournalCorrupt.
func (r *row) operation() (idemstore.Operation, error) {
	if r.version > recordVersion {
		return idemstore.Operation{}, fmt.Errorf("pgstore: record %s has version %d, this version reads %d: %w",
			r.key, r.version, recordVersion, idemstore.ErrRecordVersion)
	}
	corrupt := func(what string) error {
		return fmt.Errorf("pgstore: record %s: %s: %w", r.key, what, idemstore.ErrJournalCorrupt)
	}
	if r.version < 1 {
		return idemstore.Operation{}, corrupt(fmt.Sprintf("version %d", r.version))
	}
	st := idemstore.State(r.state)
	if r.state < 1 || r.state > 255 || (st != idemstore.StatePending && !st.Finished()) {
		return idemstore.Operation{}, corrupt(fmt.Sprintf("state %d", r.state))
	}
	op := idemstore.Operation{
		Key: r.key, KeyHeader: r.keyHeader, Method: r.method, URL: r.url, Host: r.host, State: st,
		Attempts: int(r.attempts), LastStatus: int(r.lastStatus), LastError: r.lastError,
		Created: fromNanos(r.created), Updated: fromNanos(r.updated),
		Owner: r.owner, LeaseUntil: fromNanos(r.leaseUntil),
		Redacted: r.redacted, Unreplayable: r.unreplayable, Body: r.body, Trace: r.trace,
	}
	if r.name != nil {
		op.Name = *r.name
	}
	if len(r.fingerprint) != len(op.Fingerprint) {
		return idemstore.Operation{}, corrupt(fmt.Sprintf("fingerprint of %d bytes", len(r.fingerprint)))
	}
	copy(op.Fingerprint[:], r.fingerprint)
	var err error
	if op.History, err = decodeHistory(r.history); err != nil {
		return idemstore.Operation{}, corrupt("history")
	}
	if r.header != nil {
		if op.Header, err = decodeHeader(r.header); err != nil || op.Header == nil {
			return idemstore.Operation{}, corrupt("header")
		}
	}
	return op, nil
}

// Reserve implements idemstore.KeyStore. It is one statement: an insert that
// does nothing on a conflict with the key or the name, and a select of the
// row that conflicted. It returns once PostgreSQL committed the new row.
// Reservations made at the same moment share a round trip and a commit
// (see reserver).
func (s *Store) Reserve(ctx context.Context, op idemstore.Operation) (idemstore.Operation, bool, error) {
	ctx, cancel := s.bind(ctx, reserveTimeout)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return idemstore.Operation{}, false, err
	}
	header, err := encodeHeader(op.Header)
	if err != nil {
		return idemstore.Operation{}, false, fmt.Errorf("pgstore: reserve %s: header: %w", op.Key, err)
	}
	history, err := encodeHistory(op.History)
	if err != nil {
		return idemstore.Operation{}, false, fmt.Errorf("pgstore: reserve %s: history: %w", op.Key, err)
	}
	// The history goes as text, which PostgreSQL parses as jsonb in every
	// query mode: as []byte, pgx's exec and simple_protocol modes (those
	// a pooler needs) send it as bytea, which jsonb refuses (22P02).
	var historyArg any
	if history != nil {
		historyArg = string(history)
	}
	id := s.reserveIDs.Add(1)
	args := []any{op.Key, nullName(op.Name), recordVersion, op.Method, op.URL, op.Host, op.Fingerprint[:], int16(op.State),
		int64(op.Attempts), int32(op.LastStatus), op.LastError, nanos(op.Created), nanos(op.Updated), op.Owner,
		nanos(op.LeaseUntil), op.Redacted, op.Unreplayable, header, op.Body, s.incarnation, id, op.KeyHeader,
		op.Trace, historyArg}
	res := s.reserver.do(ctx, op, id, args)
	if res.alone {
		return s.reserveOne(ctx, op, id, args, res.doubt)
	}
	return res.rec, res.created, res.err
}

// reserveOne is Reserve's statement, run on its own. doubt says that an
// earlier try may have committed the row. A try whose answer was lost is
// made again: it finds the row if the lost one committed it. When no try
// answers, the error matches idemstore.ErrOutcomeUnknown if one may have been
// carried out, and idemstore.ErrJournalWrite if none was.
func (s *Store) reserveOne(ctx context.Context, op idemstore.Operation, id int64, args []any, doubt bool) (idemstore.Operation, bool, error) {
	last := errors.New("the conflicting row kept changing")
	for try := range reserveTries {
		if try > 0 && doubt && !sleep(ctx, time.Duration(try)*markRetryMin) {
			break
		}
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			last = err // nothing sent
			break
		}
		var r row
		var created bool
		err = conn.QueryRow(ctx, s.q.reserve, args...).Scan(append(r.dest(), &created)...)
		conn.Release()
		switch {
		case err == nil:
			return s.reserved(op, id, &r, created)
		case errors.Is(err, pgx.ErrNoRows):
			continue // lost a race to a row committed after the snapshot
		case maybeSent(err):
			doubt, last = true, err
			continue
		}
		last = err
		break
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(last, cause) {
		// pgx reports a context that ended as ctx.Err(): keep the caller's
		// cause (its own deadline error) in the chain as well.
		last = fmt.Errorf("%w: %w", cause, last)
	}
	if doubt {
		return idemstore.Operation{}, false, unknownError("reserve", op.Key, last)
	}
	return idemstore.Operation{}, false, dbError("reserve", op.Key, last)
}

// sleep waits d, or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// reserved returns Reserve's result for op, the reservation numbered id,
// from the row its statement returned. A row that this store wrote for
// this very reservation (its incarnation and id) is the row of an earlier
// try whose answer was lost: it is reported created.
func (s *Store) reserved(op idemstore.Operation, id int64, r *row, created bool) (idemstore.Operation, bool, error) {
	if created || r.reserveID == id && r.incarnation == s.incarnation && r.key == op.Key {
		return op, true, nil // shares op.Header and op.Body, as the contract allows
	}
	rec, err := r.operation()
	return rec, false, err
}

// Get implements idemstore.KeyStore.
func (s *Store) Get(ctx context.Context, key string) (idemstore.Operation, error) {
	ctx, cancel := s.bind(ctx, 0)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return idemstore.Operation{}, err
	}
	var r row
	err := s.pool.QueryRow(ctx, s.q.get, key).Scan(r.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return idemstore.Operation{}, fmt.Errorf("pgstore: get %s: %w", key, idemstore.ErrNotFound)
	}
	if err != nil {
		return idemstore.Operation{}, dbError("get", key, err)
	}
	return r.operation()
}

// Attempt implements idemstore.KeyStore. It returns once PostgreSQL took the
// change, committed asynchronously (see the package documentation), or,
// if it could not within ctx or 2 seconds, once the change is queued in
// this process: it is then written in the background, and a crash of
// this process before that loses it. The journal passes error text as
// every store keeps it (valid UTF-8, no NUL, at most 2 KiB); a mark whose
// text PostgreSQL refuses anyway is written once more without it. The same
// statement appends the attempt to the row's history (a jsonb array),
// keeping the newest idemstore.MaxHistory.
//
// Attempt and Finish change only a pending row that a.Owner (o.Owner)
// holds through this very Store: the same owner name in another
// incarnation (a restarted process) that took the row over is another
// holder, as for Renew. A mark that changes nothing on a row that exists
// returns nil and is logged at Info with its key (idemstore.KeyStore.Attempt).
func (s *Store) Attempt(ctx context.Context, key string, a idemstore.Attempt) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	entry, err := encodeEntry(a)
	if err != nil {
		return fmt.Errorf("pgstore: attempt %s: history: %w", key, err)
	}
	return s.marks.write(ctx, mark{what: "attempt", key: key, sql: s.q.attempt, text: 3, owner: a.Owner,
		args: []any{key, int64(a.Sent), int32(a.Status), a.Err, nanos(a.At), string(entry), a.Owner, s.incarnation}})
}

// Finish implements idemstore.KeyStore, with Attempt's durability: when it
// returns nil the outcome is committed (asynchronously) or, if PostgreSQL
// did not take it within ctx or 2 seconds, held in this process's memory
// and written as soon as PostgreSQL takes it. A crash of this process in
// that time loses the outcome: the operation is still pending, and
// Resume, on any replica, sends it again under its key, so the provider
// replays its answer; the caller's response was delivered already.
func (s *Store) Finish(ctx context.Context, key string, o idemstore.Outcome) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.marks.write(ctx, mark{what: "finish", key: key, sql: s.q.finish, many: s.q.finishMany, text: 4, owner: o.Owner,
		args: []any{key, int16(o.State), int64(o.Sent), int32(o.Status), o.Err, nanos(o.At), o.URL, o.Owner, s.incarnation}})
}

// Pending implements idemstore.KeyStore.
func (s *Store) Pending(ctx context.Context, after string, limit int) ([]idemstore.Operation, error) {
	ctx, cancel := s.bind(ctx, 0)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	return s.collect(ctx, "pending", s.q.pending, after, limitArg(limit))
}

func limitArg(limit int) any {
	if limit <= 0 {
		return nil // LIMIT NULL: no limit
	}
	return int64(limit)
}

// collect runs a query of whole rows. A row it cannot read is returned with
// only its key and, in LastError, why; its error is joined into the
// result's.
func (s *Store) collect(ctx context.Context, what, sql string, args ...any) ([]idemstore.Operation, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, dbError(what, "", err)
	}
	defer rows.Close()
	var ops []idemstore.Operation
	var bad []error
	for rows.Next() {
		var r row
		if err := rows.Scan(r.dest()...); err != nil {
			return nil, dbError(what, "", err)
		}
		op, err := r.operation()
		if err != nil {
			op = idemstore.Operation{Key: r.key, LastError: err.Error()}
			bad = append(bad, err)
		}
		ops = append(ops, op)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError(what, "", err)
	}
	return ops, errors.Join(bad...)
}

// Sweep implements idemstore.KeyStore.
// It deletes in chunks of opSweepChunk (250) rows, each one statement bounded as
// every call is, so that a large sweep makes progress and a stalled one
// ends. Sweeps may overlap (replicas' schedules, idem gc beside a running
// service): each chunk skips the rows another transaction holds, and once
// a chunk comes back short, a last pass waits for the rows others held
// and deletes whatever they left, so Sweep returns only when no finished
// row older than cutoff is left (or with an error). The count is the rows
// this call deleted: overlapping sweeps' counts add up to the rows gone.
//
// Its cost to live traffic is bounded: one connection of the pool at a
// time, busy at most a sixth of the sweep's time (after each full chunk,
// Sweep rests five times as long as the chunk took), one statement
// holding at most 250 row locks (rows live calls never touch: finished
// and old), and chunks committed asynchronously (synchronous_commit=off
// for the chunk), so a chunk does not wait for a WAL flush and live
// commits do not queue behind it; a crash of the server itself can only
// bring back rows that the next Sweep deletes. A sweep therefore takes
// about six times as long as its deletes alone: on this project's 2-core
// machine, 1,000,000 rows of 1 KB in 81 to 86 s (about 12,000 rows a
// second) while live p99 was 0.79 to 1.13× what it was without
// (TestSweepUnderTraffic; BENCHMARKS.md).
func (s *Store) Sweep(ctx context.Context, cutoff time.Time) (int, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	n := 0
	chunk := func(sql string) (int, error) {
		cctx, cancel := s.bind(ctx, 0)
		defer cancel()
		if err := s.ready(cctx); err != nil {
			return 0, err
		}
		tag, err := s.pool.Exec(cctx, sql, nanos(cutoff), opSweepChunk)
		return int(tag.RowsAffected()), err
	}
	for {
		start := time.Now()
		d, err := chunk(s.q.sweep)
		n += d
		if err == nil && d == opSweepChunk {
			// A full chunk: more rows wait. Leave the connection, the
			// CPU, the locks and the WAL to live calls for opSweepRest
			// times as long as the chunk took.
			if !sleep(ctx, opSweepRest*time.Since(start)) {
				return n, dbError("sweep", "", context.Cause(ctx))
			}
			continue
		}
		if err == nil {
			d, err = chunk(s.q.sweepWait)
			n += d
			if err == nil && d == 0 {
				return n, nil
			}
		}
		if err != nil {
			return n, dbError("sweep", "", err)
		}
	}
}

// Pace of Sweep: how many rows one statement deletes at most, and how
// long Sweep rests after a full chunk, in multiples of the time the chunk
// took. TestSweepUnderTraffic chose them: on 2 cores shared by PostgreSQL,
// the client and its server, chunks of 1,000 rows with a rest as long as
// the chunk raised live p99 1.44–1.62× (200,000 rows), chunks of 250
// with a rest of three times 1.26–1.27× (1,000,000 rows, whose deletes'
// WAL keeps PostgreSQL checkpointing through the sweep); see
// BENCHMARKS.md for the figures of these.
const (
	opSweepChunk = 250
	opSweepRest  = 5
)

// LastChange returns when the journal last changed: the latest Updated of
// its records, as the replicas' clocks wrote it, or the zero time for an
// empty journal. A Client reads it when it opens the store, so that a clock
// set ahead does not sweep records away (see idemstore.KeyStore).
func (s *Store) LastChange(ctx context.Context) (time.Time, error) {
	ctx, cancel := s.bind(ctx, 0)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		return time.Time{}, err
	}
	var n int64
	if err := s.pool.QueryRow(ctx, s.q.lastChange).Scan(&n); err != nil {
		return time.Time{}, dbError("last change", "", err)
	}
	return fromNanos(n), nil
}
