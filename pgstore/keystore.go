package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem"
)

var _ idem.KeyStore = (*Store)(nil)

// recordVersion is the row format this package writes and reads.
const recordVersion = 1

// reserveTries bounds how often Reserve runs its statement again after
// racing with another replica's insert of the same name or key; each retry
// sees the row the race was lost to, so two suffice.
const reserveTries = 4

// check returns an error if ctx is done or the store is closed.
func (s *Store) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return idem.ErrClosed
	}
	return nil
}

// ready is check for every method but Attempt and Finish: it also writes
// the marks waiting to be written again first, so that reads see them and
// later changes apply after them. When they cannot be written, neither
// can this call's change: it fails with idem.ErrJournalWrite.
func (s *Store) ready(ctx context.Context) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	if s.marks.waiting() {
		if err := s.marks.flush(ctx); err != nil {
			return fmt.Errorf("pgstore: writing accepted changes: %w: %w", idem.ErrJournalWrite, err)
		}
	}
	return nil
}

// dbError wraps an error from PostgreSQL: the journal could not be
// reached or could not take the change.
func dbError(what, key string, err error) error {
	return fmt.Errorf("pgstore: %s %s: %w: %w", what, key, idem.ErrJournalWrite, err)
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
}

func (r *row) dest() []any {
	return []any{&r.key, &r.name, &r.version, &r.method, &r.url, &r.host, &r.fingerprint, &r.state,
		&r.attempts, &r.lastStatus, &r.lastError, &r.created, &r.updated, &r.owner,
		&r.leaseUntil, &r.redacted, &r.unreplayable, &r.header, &r.body}
}

// operation checks the row and returns it as an Operation. A row it cannot
// read is an error matching idem.ErrRecordVersion (a newer format) or
// idem.ErrJournalCorrupt.
func (r *row) operation() (idem.Operation, error) {
	if r.version > recordVersion {
		return idem.Operation{}, fmt.Errorf("pgstore: record %s has version %d, this version reads %d: %w",
			r.key, r.version, recordVersion, idem.ErrRecordVersion)
	}
	corrupt := func(what string) error {
		return fmt.Errorf("pgstore: record %s: %s: %w", r.key, what, idem.ErrJournalCorrupt)
	}
	if r.version < 1 {
		return idem.Operation{}, corrupt(fmt.Sprintf("version %d", r.version))
	}
	st := idem.State(r.state)
	if r.state < 1 || r.state > 255 || (st != idem.StatePending && !st.Finished()) {
		return idem.Operation{}, corrupt(fmt.Sprintf("state %d", r.state))
	}
	op := idem.Operation{
		Key: r.key, Method: r.method, URL: r.url, Host: r.host, State: st,
		Attempts: int(r.attempts), LastStatus: int(r.lastStatus), LastError: r.lastError,
		Created: fromNanos(r.created), Updated: fromNanos(r.updated),
		Owner: r.owner, LeaseUntil: fromNanos(r.leaseUntil),
		Redacted: r.redacted, Unreplayable: r.unreplayable, Body: r.body,
	}
	if r.name != nil {
		op.Name = *r.name
	}
	if len(r.fingerprint) != len(op.Fingerprint) {
		return idem.Operation{}, corrupt(fmt.Sprintf("fingerprint of %d bytes", len(r.fingerprint)))
	}
	copy(op.Fingerprint[:], r.fingerprint)
	if r.header != nil {
		var err error
		if op.Header, err = decodeHeader(r.header); err != nil || op.Header == nil {
			return idem.Operation{}, corrupt("header")
		}
	}
	return op, nil
}

// Reserve implements idem.KeyStore. It is one statement: an insert that
// does nothing on a conflict with the key or the name, and a select of the
// row that conflicted. It returns once PostgreSQL committed the new row.
// Reservations made at the same moment share a round trip and a commit
// (see reserver).
func (s *Store) Reserve(ctx context.Context, op idem.Operation) (idem.Operation, bool, error) {
	if err := s.ready(ctx); err != nil {
		return idem.Operation{}, false, err
	}
	if err := idem.CheckKey(op.Key); err != nil {
		return idem.Operation{}, false, err
	}
	header, err := encodeHeader(op.Header)
	if err != nil {
		return idem.Operation{}, false, fmt.Errorf("pgstore: reserve %s: header: %w", op.Key, err)
	}
	args := []any{op.Key, nullName(op.Name), recordVersion, op.Method, op.URL, op.Host, op.Fingerprint[:], int16(op.State),
		int64(op.Attempts), int32(op.LastStatus), op.LastError, nanos(op.Created), nanos(op.Updated), op.Owner,
		nanos(op.LeaseUntil), op.Redacted, op.Unreplayable, header, op.Body}
	res := s.reserver.do(ctx, op, args)
	if res.alone {
		return s.reserveOne(ctx, op, args)
	}
	return res.rec, res.created, res.err
}

// reserveOne is Reserve's statement, run on its own.
func (s *Store) reserveOne(ctx context.Context, op idem.Operation, args []any) (idem.Operation, bool, error) {
	for range reserveTries {
		var r row
		var created bool
		err := s.pool.QueryRow(ctx, s.q.reserve, args...).Scan(append(r.dest(), &created)...)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // lost a race to a row committed after the snapshot
		case err != nil:
			return idem.Operation{}, false, dbError("reserve", op.Key, err)
		}
		return reserved(op, &r, created)
	}
	return idem.Operation{}, false, dbError("reserve", op.Key, errors.New("the conflicting row kept changing"))
}

// reserved returns Reserve's result for op from the row its statement
// returned.
func reserved(op idem.Operation, r *row, created bool) (idem.Operation, bool, error) {
	if created {
		return op, true, nil // shares op.Header and op.Body, as the contract allows
	}
	rec, err := r.operation()
	return rec, false, err
}

// Acquire implements idem.KeyStore.
func (s *Store) Acquire(ctx context.Context, key string, l idem.Lease, header http.Header, body []byte) (idem.Operation, error) {
	if err := s.ready(ctx); err != nil {
		return idem.Operation{}, err
	}
	h, err := encodeHeader(header)
	if err != nil {
		return idem.Operation{}, fmt.Errorf("pgstore: acquire %s: header: %w", key, err)
	}
	var r row
	err = s.pool.QueryRow(ctx, s.q.acquire, key, l.Owner, nanos(l.Until), nanos(l.At), h, body, nanos(l.At)).Scan(r.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Operation{}, s.whyNot(ctx, "acquire", key, idem.ErrInProgress)
	}
	if err != nil {
		return idem.Operation{}, dbError("acquire", key, err)
	}
	return r.operation()
}

// whyNot explains why a lease change matched no row: there is none
// (idem.ErrNotFound), or refused, naming the state or the holder.
func (s *Store) whyNot(ctx context.Context, what, key string, refused error) error {
	var state int16
	var owner string
	var until int64
	err := s.pool.QueryRow(ctx, s.q.leaseOf, key).Scan(&state, &owner, &until)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("pgstore: %s %s: %w", what, key, idem.ErrNotFound)
	case err != nil:
		return dbError(what, key, err)
	case idem.State(state) != idem.StatePending:
		return fmt.Errorf("pgstore: %s %s: operation is %s: %w", what, key, idem.State(state), refused)
	}
	return fmt.Errorf("pgstore: %s %s: leased to %q until %s: %w", what, key, owner, fromNanos(until).Format(time.RFC3339Nano), refused)
}

// Renew implements idem.KeyStore.
func (s *Store) Renew(ctx context.Context, key string, l idem.Lease) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, s.q.renew, key, l.Owner, nanos(l.Until))
	if err != nil {
		return dbError("renew", key, err)
	}
	if tag.RowsAffected() == 0 {
		return s.whyNot(ctx, "renew", key, idem.ErrLeaseLost)
	}
	return nil
}

// Get implements idem.KeyStore.
func (s *Store) Get(ctx context.Context, key string) (idem.Operation, error) {
	if err := s.ready(ctx); err != nil {
		return idem.Operation{}, err
	}
	var r row
	err := s.pool.QueryRow(ctx, s.q.get, key).Scan(r.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Operation{}, fmt.Errorf("pgstore: get %s: %w", key, idem.ErrNotFound)
	}
	if err != nil {
		return idem.Operation{}, dbError("get", key, err)
	}
	return r.operation()
}

// Attempt implements idem.KeyStore. The change is committed
// asynchronously (see the package documentation); if PostgreSQL cannot
// take it now, it is kept and written again until it is, and Attempt still
// returns nil: the change is accepted.
func (s *Store) Attempt(ctx context.Context, key string, a idem.Attempt) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.mark(mark{what: "attempt", key: key, sql: s.q.attempt,
		args: []any{key, int64(a.Sent), int32(a.Status), a.Err, nanos(a.At)}})
}

// Finish implements idem.KeyStore. The change is committed as Attempt's
// is.
func (s *Store) Finish(ctx context.Context, key string, o idem.Outcome) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	if !o.State.Finished() {
		return fmt.Errorf("pgstore: finish %s: state %s is not final", key, o.State)
	}
	return s.mark(mark{what: "finish", key: key, sql: s.q.finish,
		args: []any{key, int16(o.State), int64(o.Sent), int32(o.Status), o.Err, nanos(o.At)}})
}

// Pending implements idem.KeyStore.
func (s *Store) Pending(ctx context.Context, after string, limit int) ([]idem.Operation, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	return s.collect(ctx, "pending", s.q.pending, after, limitArg(limit))
}

// Claim implements idem.KeyStore. It is one statement: a select of the
// claimable rows FOR UPDATE SKIP LOCKED and an update of their lease.
func (s *Store) Claim(ctx context.Context, l idem.Lease, after string, limit int) ([]idem.Operation, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	ops, err := s.collect(ctx, "claim", s.q.claim, after, l.Owner, nanos(l.At), limitArg(limit), nanos(l.Until))
	// UPDATE ... RETURNING returns rows in no particular order.
	slices.SortFunc(ops, func(a, b idem.Operation) int { return strings.Compare(a.Key, b.Key) })
	return ops, err
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
func (s *Store) collect(ctx context.Context, what, sql string, args ...any) ([]idem.Operation, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, dbError(what, "", err)
	}
	defer rows.Close()
	var ops []idem.Operation
	var bad []error
	for rows.Next() {
		var r row
		if err := rows.Scan(r.dest()...); err != nil {
			return nil, dbError(what, "", err)
		}
		op, err := r.operation()
		if err != nil {
			op = idem.Operation{Key: r.key, LastError: err.Error()}
			bad = append(bad, err)
		}
		ops = append(ops, op)
	}
	if err := rows.Err(); err != nil {
		return nil, dbError(what, "", err)
	}
	return ops, errors.Join(bad...)
}

// Sweep implements idem.KeyStore.
func (s *Store) Sweep(ctx context.Context, cutoff time.Time) (int, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	tag, err := s.pool.Exec(ctx, s.q.sweep, nanos(cutoff))
	if err != nil {
		return 0, dbError("sweep", "", err)
	}
	return int(tag.RowsAffected()), nil
}

// LastChange returns when the journal last changed: the latest Updated of
// its records, as the replicas' clocks wrote it, or the zero time for an
// empty journal. A Client reads it when it opens the store, so that a clock
// set ahead does not sweep records away (see idem.KeyStore).
func (s *Store) LastChange(ctx context.Context) (time.Time, error) {
	if err := s.ready(ctx); err != nil {
		return time.Time{}, err
	}
	var n int64
	if err := s.pool.QueryRow(ctx, s.q.lastChange).Scan(&n); err != nil {
		return time.Time{}, dbError("last change", "", err)
	}
	return fromNanos(n), nil
}
