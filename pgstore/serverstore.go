package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/idemserver"
	"github.com/idemgo/idem/idemstore"
)

// ServerStore is an idemserver.Store on PostgreSQL: the inbound keys of
// every replica of a fleet in one table, so that a retry that lands on
// another replica than the first request is answered 409 while the first
// runs and replayed once it is done. It is safe for concurrent use by many
// goroutines and by many processes sharing one database and schema.
//
// Begin is one statement, one round trip and one commit: an insert that,
// on a conflict, takes over the existing row only if it expired, and
// otherwise reads the row it conflicted with. Renew, Complete and Release
// are single updates or deletes guarded by id, token and (Renew,
// Complete) a live lease, all in the same statement. Begin and Complete
// return after PostgreSQL committed their change, so with the server's
// default synchronous_commit=on a claimed key and a stored response are
// on disk before the handler runs and before the response is sent.
//
// One clock: the database's. The store judges every lease and expiry by
// PostgreSQL's clock_timestamp(), never by the replica's: from the times
// the middleware passes it keeps only the durations (a lease is
// LeaseUntil minus Now, a retention Until minus Now) and adds them to the
// database's time. A replica whose clock runs ahead cannot take over a
// live key, and one whose clock lags cannot keep a lapsed one.
// (clock_timestamp, not now(): now() is the start of the transaction,
// which for a request's transaction may be long before its commit.)
//
// The request's transaction: ServerStore is an idemserver.TxStore; see
// Tx for how a handler writes its rows in the same transaction as the
// stored answer.
//
// Event consumers: Once records a delivered event id and Advance an
// entity's newest version in the consumer's own transaction (any pgx.Tx,
// Tx's included), so that a redelivered event runs once and an older one
// never overwrites a newer state; RequestAdvancer orders idemserver's
// Webhook routes (idemserver.WithOrder) the same way. Their records expire
// after a retention per scope (WithEventRetention) and are deleted by
// Sweep with the inbound keys.
//
// Failures: every error from PostgreSQL (unreachable, restarted, a
// terminated connection) matches idemstore.ErrJournalWrite and wraps pgx's
// error, so the middleware answers 503 without running the handler (fail
// closed); an error caused by the caller's context is returned as it is.
// A row that cannot be read matches idemstore.ErrJournalCorrupt. The
// middleware bounds each call with its store timeout; bound connection
// attempts with connect_timeout in the DSN too.
//
// Cost: Begin locks the row it finds even when it only reads it (a replay
// or a 409), so every Begin is a write transaction and, with
// synchronous_commit=on, waits for one WAL flush.
//
// Renewals have connections of their own: the store keeps a second pool
// of at most two connections, made from the given pool's configuration
// and opened on first use, that only Renew uses. Handlers holding their
// request transactions (Tx) past the lease, as many as the pool has
// connections, so never starve their own renewals and are not fenced
// for it; the database sees up to two connections more than
// pool_max_conns. Close closes that pool (NewServerStore's caller still
// closes its own).
//
// Schema: the tables inbound_keys, event_ids and entity_versions live in
// the store's schema (see WithSchema), next to the client Store's tables,
// and are created by the same embedded, versioned migrations under the
// same advisory lock, so replicas that start at once migrate once. A record whose answer was not
// kept (idemserver.Response.NotKept) is a row with a negative status,
// -1 minus the status sent, and no header or body.
type ServerStore struct {
	pool *pgxpool.Pool
	// renewals is the store's own small pool, made from pool's config,
	// that only Renew uses: request transactions that fill pool never
	// hold up a renewal (see the type's doc).
	renewals *pgxpool.Pool
	ownPool  bool // OpenServerStore made the pool, so Close closes it
	schema   string
	q        serverQueries
	eq       eventQueries
	events   map[string]time.Duration // retention of Once's and Advance's records by scope
	closed   atomic.Bool
	// callerClock makes the store judge leases by the times its callers
	// pass, as stores without a shared clock do; for tests that move time
	// (see export_test.go), never for production.
	callerClock bool
	// eventClock, when set, is the time Once and Advance judge expiry by
	// (see export_test.go), for tests; nil is the database's clock.
	eventClock func() time.Time
}

var _ idemserver.TxStore = (*ServerStore)(nil)

// OpenServerStore connects to the database at dsn (a PostgreSQL URL or
// key=value string, as pgxpool.ParseConfig takes), creates or migrates
// the store's schema, and returns the ServerStore. Close closes the
// connection pool. An unreachable database gives an error matching
// idemstore.ErrJournalWrite.
func OpenServerStore(ctx context.Context, dsn string, opts ...Option) (*ServerStore, error) {
	pool, err := connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	s, err := NewServerStore(ctx, pool, opts...)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownPool = true
	return s, nil
}

// NewServerStore returns a ServerStore on an existing pool, after creating
// or migrating its schema. Close leaves the pool open: it belongs to the
// caller, who may share it with a client Store.
func NewServerStore(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*ServerStore, error) {
	c, err := configure(opts)
	if err != nil {
		return nil, err
	}
	if err := migrate(ctx, pool, c.schema, idemstore.ErrJournalWrite); err != nil {
		return nil, err
	}
	rc := pool.Config()
	rc.MaxConns, rc.MinConns = renewalConns, 0
	renewals, err := pgxpool.NewWithConfig(ctx, rc)
	if err != nil {
		return nil, fmt.Errorf("pgstore: renewal pool: %w: %w", idemstore.ErrJournalWrite, err)
	}
	return &ServerStore{pool: pool, renewals: renewals, schema: c.schema, q: newServerQueries(c.schema), eq: newEventQueries(c.schema), events: c.events}, nil
}

// renewalConns is the size of a ServerStore's renewal pool. A renewal is
// one short update, so two connections carry the renewals of many
// requests, and one renewal stuck behind a row someone else locked does
// not hold up the others'.
const renewalConns = 2

// Pool returns the connection pool the store uses.
func (s *ServerStore) Pool() *pgxpool.Pool { return s.pool }

// Schema returns the PostgreSQL schema that holds the store's table.
func (s *ServerStore) Schema() string { return s.schema }

// serverQueries holds the ServerStore's SQL with its table name filled in.
// Each is one statement, so one implicit transaction and one commit
// (complete also runs inside a request's transaction).
type serverQueries struct {
	begin, renew, complete, release, sweep, sweepWait string
}

// sweepChunk bounds the rows one Sweep statement deletes, so that no
// request waits behind one long delete; after a full chunk, Sweep rests
// as the KeyStore's does (opSweepRest).
const sweepChunk = opSweepChunk

// serverNow is the database's time in Unix nanoseconds, unless the parameter
// it is given holds the caller's (callerClock).
func serverNow(param string) string {
	return `coalesce(` + param + `::bigint, (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint)`
}

func newServerQueries(schema string) serverQueries {
	t := pgx.Identifier{schema, "inbound_keys"}.Sanitize()
	return serverQueries{
		// Begin: $1 id, $2 fingerprint, $3 new token, $4 caller's now or
		// NULL, $5 lease in nanoseconds. The upsert replaces a row that
		// expired by the statement's time and locks any other; then the
		// second branch reads that row. It reads it from the statement's
		// snapshot, which misses a row committed after the snapshot was
		// taken (no row comes back) and may show a version older than the
		// one the upsert locked (an expired one); the caller then runs the
		// statement again, with a new snapshot.
		begin: `WITH c AS MATERIALIZED (SELECT ` + serverNow("$4") + ` AS now),
		up AS (
			INSERT INTO ` + t + ` AS k (id, fingerprint, token, expires) SELECT $1, $2, $3, c.now + $5 FROM c
			ON CONFLICT (id) DO UPDATE SET fingerprint = excluded.fingerprint, token = excluded.token,
				expires = excluded.expires, status = NULL, header = NULL, body = NULL
			WHERE k.expires <= excluded.expires - $5::bigint
			RETURNING 1
		)
		SELECT true, '', 0::bigint, NULL::integer, NULL::bytea, NULL::bytea, c.now FROM up, c
		UNION ALL
		SELECT false, k.fingerprint, k.expires, k.status, k.header, k.body, c.now FROM ` + t + ` k, c
		WHERE k.id = $1 AND NOT EXISTS (SELECT 1 FROM up)`,

		// Renew: $2 token, $3 caller's now or NULL, $4 lease in ns.
		renew: `UPDATE ` + t + ` k SET expires = c.now + $4 FROM (SELECT ` + serverNow("$3") + ` AS now) c
		WHERE k.id = $1 AND k.token = $2 AND k.status IS NULL AND k.expires > c.now`,

		// Complete: $2 token, $3 caller's now or NULL, $4 status, $5
		// header, $6 body, $7 retention in ns.
		complete: `UPDATE ` + t + ` k SET token = '', status = $4, header = $5, body = $6, expires = c.now + $7
		FROM (SELECT ` + serverNow("$3") + ` AS now) c
		WHERE k.id = $1 AND k.token = $2 AND k.status IS NULL AND k.expires > c.now`,

		release: `DELETE FROM ` + t + ` WHERE id = $1 AND token = $2 AND status IS NULL`,

		// Sweep: $1 caller's now or NULL. Rows that another statement
		// holds (a Begin taking an expired key over, another replica's
		// Sweep) are skipped; rows changed since the snapshot are checked
		// again when locked.
		sweep: `DELETE FROM ` + t + ` WHERE id IN (
			SELECT id FROM ` + t + ` WHERE expires <= ` + serverNow("$1") + ` ORDER BY expires LIMIT ` + fmt.Sprint(sweepChunk) + `
			FOR UPDATE SKIP LOCKED)`,
		// sweepWait is Sweep's last pass: the same, waiting for the rows
		// others hold, so that the rows another Sweep left are deleted.
		sweepWait: `DELETE FROM ` + t + ` WHERE id IN (
			SELECT id FROM ` + t + ` WHERE expires <= ` + serverNow("$1") + ` ORDER BY expires LIMIT ` + fmt.Sprint(sweepChunk) + `
			FOR UPDATE)`,
	}
}

// callerNow returns t in Unix nanoseconds for a store that judges by its
// callers' clock, and nil (the database's clock) otherwise.
func (s *ServerStore) callerNow(t time.Time) *int64 {
	if !s.callerClock {
		return nil
	}
	n := nanos(t)
	return &n
}

// beginTries bounds how often Begin runs its statement again after its
// snapshot missed the row it conflicted with; each run takes a new
// snapshot, which sees that row, so two suffice unless the key is taken
// over again and again in between.
const beginTries = 4

// check returns an error if ctx is done or the store is closed.
func (s *ServerStore) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	if s.closed.Load() {
		return idemserver.ErrClosed
	}
	return nil
}

// fail wraps the error of a statement, what names it: the caller's
// context ended, the store was closed meanwhile, or else PostgreSQL could
// not take the change.
func (s *ServerStore) fail(ctx context.Context, what string, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("pgstore: %s: %w", what, context.Cause(ctx))
	case s.closed.Load():
		return fmt.Errorf("pgstore: %s: %w", what, idemserver.ErrClosed)
	case pooler(err):
		return fmt.Errorf("pgstore: %s: %w (%s): %w: %w", what, ErrPooler, poolerHint, idemstore.ErrJournalWrite, err)
	}
	return fmt.Errorf("pgstore: %s: %w: %w", what, idemstore.ErrJournalWrite, err)
}

// claimGrace bounds how long a claim's statement runs on after its
// context ended, and then how long the release of its token may take.
const claimGrace = 500 * time.Millisecond

// Begin implements idemserver.Store. A claim is never orphaned by its
// caller: the statement runs under a context of its own that ends
// claimGrace (500 ms) after ctx does (and at most 30 seconds), so a
// request whose client drops mid-claim does not cut the statement off
// between PostgreSQL's commit and its answer. If ctx ended meanwhile, or
// the statement's answer was lost, Begin deletes the row its own token may
// hold (at most another claimGrace) and returns an error: the key is free
// for the next request at once, not held until its lease lapses. Only
// when that release cannot reach PostgreSQL either is the key left to its
// lease. Begin so returns at most 1 second after ctx ends.
func (s *ServerStore) Begin(ctx context.Context, b idemserver.Begin) (idemserver.Claim, error) {
	if err := s.check(ctx); err != nil {
		return idemserver.Claim{}, err
	}
	tok := uuid.NewString()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(claimGrace, cancel) })
	defer stop()
	c, err := s.begin(sctx, b, tok)
	switch {
	case ctx.Err() != nil && (err == nil && c.State == idemserver.StateAcquired || maybeSent(err)):
		if rerr := s.abandon(ctx, b.ID, tok); rerr != nil {
			return idemserver.Claim{}, fmt.Errorf("pgstore: begin %s: the request ended during the claim, and releasing its key failed (a claim that was made holds the key until its lease ends): %w: %w",
				b.ID, context.Cause(ctx), rerr)
		}
		return idemserver.Claim{}, fmt.Errorf("pgstore: begin %s: the request ended during the claim; its key is released: %w", b.ID, context.Cause(ctx))
	case ctx.Err() != nil:
		return idemserver.Claim{}, fmt.Errorf("pgstore: begin %s: %w", b.ID, context.Cause(ctx))
	case err != nil && maybeSent(err):
		_ = s.abandon(ctx, b.ID, tok) // err says the claim's outcome is unknown; a failed release leaves the lease to end
	}
	return c, err
}

// abandon deletes the in-flight row that token may hold, within
// claimGrace, so that a claim whose caller is gone does not hold its key.
func (s *ServerStore) abandon(ctx context.Context, id, token string) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimGrace)
	defer cancel()
	_, err := s.pool.Exec(rctx, s.q.release, id, token)
	return err
}

// begin is Begin's statement, run under ctx, and tried again while its
// snapshot misses the row it conflicted with.
func (s *ServerStore) begin(ctx context.Context, b idemserver.Begin, tok string) (idemserver.Claim, error) {
	lease := nanos(b.LeaseUntil) - nanos(b.Now)
	for range beginTries {
		var (
			acquired     bool
			fp           string
			expires, now int64
			status       *int32
			header, body []byte
		)
		err := s.pool.QueryRow(ctx, s.q.begin, b.ID, b.Fingerprint, tok, s.callerNow(b.Now), lease).
			Scan(&acquired, &fp, &expires, &status, &header, &body, &now)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // the row it conflicted with is newer than the snapshot
		case err != nil:
			return idemserver.Claim{}, s.fail(ctx, "begin "+b.ID, err)
		case acquired:
			return idemserver.Claim{State: idemserver.StateAcquired, Token: tok, LeaseUntil: b.LeaseUntil}, nil
		case expires <= now:
			continue // an older version than the one the upsert found live
		case fp != b.Fingerprint:
			return idemserver.Claim{State: idemserver.StateMismatch}, nil
		case status == nil: // the holder's lease end, in the caller's time
			return idemserver.Claim{State: idemserver.StateInFlight, LeaseUntil: b.Now.Add(time.Duration(expires - now))}, nil
		case *status < 0:
			return idemserver.Claim{State: idemserver.StateDone, Response: &idemserver.Response{Status: int(-1 - *status), NotKept: true}}, nil
		}
		resp := &idemserver.Response{Status: int(*status), Body: body}
		if header != nil {
			var err error
			if resp.Header, err = decodeHeader(header); err != nil {
				return idemserver.Claim{}, fmt.Errorf("pgstore: begin %s: stored header: %w: %w", b.ID, idemstore.ErrJournalCorrupt, err)
			}
		}
		return idemserver.Claim{State: idemserver.StateDone, Response: resp}, nil
	}
	return idemserver.Claim{}, fmt.Errorf("pgstore: begin %s: the key changed under %d tries: %w", b.ID, beginTries, idemstore.ErrJournalWrite)
}

// held runs the statement q on the in-flight row id held under token,
// on pool; changing no row means the caller lost it.
func (s *ServerStore) held(ctx context.Context, pool *pgxpool.Pool, what, q, id string, args ...any) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	tag, err := pool.Exec(ctx, q, args...)
	if err != nil {
		return s.fail(ctx, what+" "+id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: %s %s: %w", what, id, idemserver.ErrLockLost)
	}
	return nil
}

// Renew implements idemserver.Store. It runs on the store's renewal pool,
// never waiting for a connection of the pool that request transactions
// hold.
func (s *ServerStore) Renew(ctx context.Context, id, token string, now, until time.Time) error {
	return s.held(ctx, s.renewals, "renew", s.q.renew, id, id, token, s.callerNow(now), nanos(until)-nanos(now))
}

// completeArgs returns the arguments of the complete statement for c.
func (s *ServerStore) completeArgs(c idemserver.Completion) ([]any, error) {
	resp := c.Response
	if resp == nil {
		return nil, fmt.Errorf("pgstore: complete %s: nil response", c.ID)
	}
	status := int32(resp.Status)
	var header, body []byte
	if resp.NotKept {
		status = -1 - status
	} else {
		var err error
		if header, err = encodeHeader(resp.Header); err != nil {
			return nil, fmt.Errorf("pgstore: complete %s: header: %w", c.ID, err)
		}
		body = resp.Body
		if body == nil {
			body = []byte{}
		}
	}
	return []any{c.ID, c.Token, s.callerNow(c.Now), status, header, body, nanos(c.Until) - nanos(c.Now)}, nil
}

// Complete implements idemserver.Store.
func (s *ServerStore) Complete(ctx context.Context, c idemserver.Completion) error {
	args, err := s.completeArgs(c)
	if err != nil {
		return err
	}
	return s.held(ctx, s.pool, "complete", s.q.complete, c.ID, args...)
}

// Release implements idemserver.Store.
func (s *ServerStore) Release(ctx context.Context, id, token string) error {
	return s.held(ctx, s.pool, "release", s.q.release, id, id, token)
}

// Sweep implements idemserver.Store. It deletes the expired inbound keys,
// then the expired records of Once and Advance, in statements of at most
// 250 rows each, resting after each full one five times as long as it
// took (so that live requests keep the CPU and the connections for five
// sixths of the sweep's time); replicas may sweep at once, each deleting
// the rows the others do not hold at that moment. Once a statement of inbound keys
// comes back short, a last one waits for the rows others held and deletes
// what they left, so no expired key is left behind another Sweep. The
// count is of every row this call deleted.
func (s *ServerStore) Sweep(ctx context.Context, now time.Time) (int, error) {
	total := 0
	for _, q := range [...]string{s.q.sweep, s.eq.sweepIDs, s.eq.sweepVersions} {
		for {
			if err := s.check(ctx); err != nil {
				return total, err
			}
			arg := s.callerNow(now)
			if q != s.q.sweep {
				arg = s.eventNow()
			}
			start := time.Now()
			tag, err := s.pool.Exec(ctx, q, arg)
			if err != nil {
				return total, s.fail(ctx, "sweep", err)
			}
			n := int(tag.RowsAffected())
			total += n
			if n == sweepChunk {
				if !sleep(ctx, opSweepRest*time.Since(start)) {
					return total, s.fail(ctx, "sweep", context.Cause(ctx))
				}
				continue
			}
			if q != s.q.sweep {
				break
			}
			if tag, err = s.pool.Exec(ctx, s.q.sweepWait, arg); err != nil {
				return total, s.fail(ctx, "sweep", err)
			}
			n = int(tag.RowsAffected())
			total += n
			if n == 0 {
				break
			}
		}
	}
	return total, nil
}

// Close implements idemserver.Store: it closes the pool if
// OpenServerStore made it. Later calls of every method, Close included,
// return an error matching idemserver.ErrClosed.
func (s *ServerStore) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return fmt.Errorf("pgstore: close: %w", idemserver.ErrClosed)
	}
	s.renewals.Close()
	if s.ownPool {
		s.pool.Close()
	}
	return nil
}
