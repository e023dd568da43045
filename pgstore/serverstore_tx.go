package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemgo/idem/idemserver"
)

// Tx returns the transaction of the request a handler serves, when the
// request holds a key of a ServerStore through idemserver's middleware: the
// handler writes its rows in it, and the middleware writes the stored
// answer in the same transaction, conditional on still holding the key
// (token and live lease, checked in the statement), and commits. Rows and
// answer are durable together or not at all:
//
//   - a 5xx, 408, 425 or 429 answer, a panic before the answer began, a
//     lost key (fencing) or a crash of the process roll both back, and a
//     retry runs the handler on a clean slate;
//   - a commit PostgreSQL refuses (a deferred constraint, a serialization
//     failure) takes rows and answer back too; the client gets 503 and the
//     key is released, so its retry runs the handler again;
//   - an answer not kept (too large, hijacked) commits the rows with a
//     "done, not kept" record.
//
// The transaction begins on the first call, with PostgreSQL's default
// isolation level, READ COMMITTED; a handler that needs another runs SET
// TRANSACTION ISOLATION LEVEL ... as its first statement. Later calls
// return the same transaction. A handler that never calls Tx holds none,
// and its answer is stored in a transaction of its own. If the
// transaction cannot begin, Tx returns one whose every method returns
// that error, and the request is answered 503. Tx returns nil outside a
// request that holds a ServerStore key; after the handler returned, it
// returns a transaction whose methods fail.
//
// The handler must not Commit or Rollback the transaction itself: the
// middleware does (a Commit by the handler is refused).
//
// A failed statement aborts a PostgreSQL transaction: every later
// statement in it fails until it rolls back. So that a handler may catch
// such an error (a unique violation) and answer it, the transaction takes
// a savepoint before the handler's first statement:
//
//   - a handler that answers 4xx over an aborted transaction (409 "name
//     taken") has its work rolled back to the savepoint, and its answer
//     is stored in the transaction and replayed to retries;
//   - a handler that answers below 400 over an aborted transaction
//     dropped an error: nothing commits, the key is released and the
//     client gets 500 ProblemTxAborted (idemserver.ErrTxAborted), not the
//     success the handler claimed;
//   - a handler that must keep some writes past a failed statement
//     wraps the statement that may fail in a savepoint of its own
//     (tx.Begin, then the nested transaction's Rollback), which leaves
//     the request's transaction usable.
//
// Cost: the transaction holds a pooled connection from its first
// statement until the answer is committed, and holds the locks its
// statements take until then. Renewals of the lease do not need one of
// the pool's connections: they run on the store's own renewal pool (see
// ServerStore), so transactions that fill the pool do not fence their
// requests. Keep it short: long external calls (a payment
// provider) belong before the first Tx call or after the handler's
// writes, or behind idemserver.Step, so that their retries are replayed by
// key; size the pool (pool_max_conns) for the requests in flight.
func Tx(ctx context.Context) pgx.Tx {
	rt, _ := ctx.Value(txContext{}).(*requestTx)
	if rt == nil {
		return nil
	}
	return rt.get(ctx)
}

// txContext is the context key of a request's *requestTx.
type txContext struct{}

// Scope implements idemserver.TxStore.
func (s *ServerStore) Scope(ctx context.Context, id, token string) (context.Context, idemserver.RequestTx) {
	rt := &requestTx{s: s, id: id, token: token}
	return context.WithValue(ctx, txContext{}, rt), rt
}

// requestTx is one request's transaction, begun on the handler's first
// Tx call and ended by the middleware.
type requestTx struct {
	s         *ServerStore
	id, token string

	mu    sync.Mutex
	tx    pgx.Tx
	err   error // the transaction could not begin
	ended bool
}

var _ idemserver.RequestTx = (*requestTx)(nil)

func (rt *requestTx) get(ctx context.Context) pgx.Tx {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	switch {
	case rt.ended:
		return failedTx{fmt.Errorf("pgstore: request %s: the request's transaction is over", rt.id)}
	case rt.err != nil:
		return failedTx{rt.err}
	case rt.tx != nil:
		return handlerTx{rt.tx}
	}
	if err := rt.s.check(ctx); err != nil {
		rt.err = err
		return failedTx{err}
	}
	tx, err := rt.s.pool.Begin(ctx)
	if err != nil {
		rt.err = rt.s.fail(ctx, "begin request transaction "+rt.id, err)
		return failedTx{rt.err}
	}
	// The savepoint lets Commit store a 4xx answer after a failed
	// statement of the handler's aborted the transaction.
	if _, err := tx.Exec(ctx, "SAVEPOINT "+handlerSavepoint); err != nil {
		_ = tx.Rollback(ctx)
		rt.err = rt.s.fail(ctx, "begin request transaction "+rt.id, err)
		return failedTx{rt.err}
	}
	rt.tx = tx
	return handlerTx{tx}
}

// handlerSavepoint is the savepoint taken at the start of a request's
// transaction, before the handler's first statement.
const handlerSavepoint = "idem_request"

// Commit implements idemserver.RequestTx.
func (rt *requestTx) Commit(ctx context.Context, c idemserver.Completion) error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.ended = true
	switch {
	case rt.err != nil:
		return fmt.Errorf("pgstore: complete %s: %w: %w", c.ID, idemserver.ErrRolledBack, rt.err)
	case rt.tx == nil:
		return rt.s.Complete(ctx, c)
	}
	tx := rt.tx
	if tx.Conn().PgConn().TxStatus() == 'E' { // a failed statement aborted the transaction
		if c.Response == nil || c.Response.Status < 400 {
			_ = tx.Rollback(ctx)
			status := 0
			if c.Response != nil {
				status = c.Response.Status
			}
			return fmt.Errorf("pgstore: complete %s: a statement of the handler failed and it answered %d: %w: %w",
				c.ID, status, idemserver.ErrTxAborted, idemserver.ErrRolledBack)
		}
		// The handler caught the error and answered 4xx: its work goes,
		// the answer stays.
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+handlerSavepoint); err != nil {
			_ = tx.Rollback(ctx)
			return fmt.Errorf("pgstore: complete %s: %w: %w", c.ID, idemserver.ErrRolledBack, err)
		}
	}
	args, err := rt.s.completeArgs(c)
	if err != nil {
		_ = tx.Rollback(ctx)
		return fmt.Errorf("%w: %w", idemserver.ErrRolledBack, err)
	}
	tag, err := tx.Exec(ctx, rt.s.q.complete, args...)
	if err != nil {
		_ = tx.Rollback(ctx)
		// No COMMIT was sent: nothing of the transaction is committed.
		return fmt.Errorf("pgstore: complete %s: %w: %w", c.ID, idemserver.ErrRolledBack, err)
	}
	if tag.RowsAffected() == 0 {
		_ = tx.Rollback(ctx)
		return fmt.Errorf("pgstore: complete %s: %w", c.ID, idemserver.ErrLockLost)
	}
	if err := tx.Commit(ctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxCommitRollback) {
			return fmt.Errorf("pgstore: commit %s: %w: %w", c.ID, idemserver.ErrRolledBack, err)
		}
		return rt.s.fail(ctx, "commit "+c.ID, err) // the outcome is unknown
	}
	return nil
}

// Rollback implements idemserver.RequestTx.
func (rt *requestTx) Rollback(ctx context.Context) error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.ended = true
	if rt.tx == nil {
		return nil
	}
	if err := rt.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("pgstore: rollback %s: %w", rt.id, err)
	}
	return nil
}

// errOwnedTx is returned to a handler that tries to end the request's
// transaction itself.
var errOwnedTx = errors.New("pgstore: the request's transaction is committed or rolled back by the middleware")

// handlerTx is the request's transaction as the handler sees it: Commit
// and Rollback are the middleware's.
type handlerTx struct{ pgx.Tx }

func (handlerTx) Commit(context.Context) error   { return errOwnedTx }
func (handlerTx) Rollback(context.Context) error { return errOwnedTx }

// failedTx is a pgx.Tx that could not begin: every method returns err.
type failedTx struct{ err error }

var _ pgx.Tx = failedTx{}

func (f failedTx) Begin(context.Context) (pgx.Tx, error) { return nil, f.err }
func (f failedTx) Commit(context.Context) error          { return f.err }
func (f failedTx) Rollback(context.Context) error        { return f.err }
func (f failedTx) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, f.err
}
func (f failedTx) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults { return failedBatch(f) }
func (f failedTx) LargeObjects() pgx.LargeObjects                         { return pgx.LargeObjects{} }
func (f failedTx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, f.err
}
func (f failedTx) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, f.err
}
func (f failedTx) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, f.err }
func (f failedTx) QueryRow(context.Context, string, ...any) pgx.Row        { return failedRow(f) }
func (f failedTx) Conn() *pgx.Conn                                         { return nil }

type failedRow failedTx

func (f failedRow) Scan(...any) error { return f.err }

type failedBatch failedTx

func (f failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, f.err }
func (f failedBatch) Query() (pgx.Rows, error)         { return nil, f.err }
func (f failedBatch) QueryRow() pgx.Row                { return failedRow(f) }
func (f failedBatch) Close() error                     { return f.err }
func (f failedBatch) Tx() pgx.Tx                       { return failedTx(f) }
