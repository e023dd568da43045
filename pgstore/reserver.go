package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/idemstore"
)

// Bounds of a group of reservations.
const (
	reserveBatchMax = 64
	// reserveTimeout bounds a Reserve whose context has no earlier
	// deadline, and one group's round trip.
	reserveTimeout = 30 * time.Second
)

// reserver is Reserve's group commit: one goroutine sends every Reserve
// queued while its last group ran as one statement (queries.reserveMany:
// the group's rows as one array per column), one transaction: one round
// trip and one commit (one WAL flush) for the group, without a timer, and
// the statement's own cost (parsing its arguments, starting its executor)
// paid once. At one call in flight a group is that call alone and runs
// reserve's statement; at 32 in flight, groups of about ten share the
// WAL flush that dominates a commit.
//
// A caller waits for its group within its own context. If the context
// ends while the reservation is still queued, nothing was sent for it; if
// it ends once the group was sent, the row may be committed and the caller
// says so (idemstore.ErrOutcomeUnknown). A group whose callers all left is
// cancelled.
//
// A group is all or nothing. If it fails (the server is away, a deadlock
// with another replica's group on the same names), each caller runs its
// own statement, as it would without groups, and gets its own answer; if
// the group may have committed before it failed, that statement finds the
// caller's own row and reports it created (see reserved).
type reserver struct {
	store *Store
	pool  *pgxpool.Pool
	base  context.Context // ends when the store gives up on PostgreSQL at Close
	mu    sync.Mutex
	queue []*reservation
	// sending is the size of the group being sent (for the tests).
	sending int
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

// States of a reservation.
const (
	rvQueued int32 = iota
	rvSent         // its group was sent: it may be committed
	rvLeft         // its caller left before it was sent
)

// reservation is one Reserve waiting for its group.
type reservation struct {
	ctx   context.Context
	op    idemstore.Operation
	id    int64
	args  []any
	state atomic.Int32
	res   chan reserveResult // buffered
}

type reserveResult struct {
	rec     idemstore.Operation
	created bool
	err     error
	alone   bool // not decided by the group: run the statement alone
	doubt   bool // with alone: the group may have committed the row
}

func newReserver(s *Store) *reserver {
	r := &reserver{store: s, pool: s.pool, base: s.base, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

// do queues a reservation and waits for its group's result, within ctx.
func (r *reserver) do(ctx context.Context, op idemstore.Operation, id int64, args []any) reserveResult {
	rv := &reservation{ctx: ctx, op: op, id: id, args: args, res: make(chan reserveResult, 1)}
	r.mu.Lock()
	select {
	case <-r.stop:
		r.mu.Unlock()
		return reserveResult{err: fmt.Errorf("pgstore: reserve %s: %w", op.Key, idemstore.ErrClosed)}
	default:
	}
	r.queue = append(r.queue, rv)
	r.mu.Unlock()
	signal(r.wake)
	select {
	case res := <-rv.res:
		return res
	case <-ctx.Done():
	}
	select {
	case res := <-rv.res:
		return res
	default:
	}
	cause := context.Cause(ctx)
	if rv.state.CompareAndSwap(rvQueued, rvLeft) {
		return reserveResult{err: fmt.Errorf("pgstore: reserve %s: not sent: %w: %w", op.Key, idemstore.ErrJournalWrite, cause)}
	}
	return reserveResult{err: unknownError("reserve", op.Key, cause)}
}

func (r *reserver) run() {
	defer close(r.done)
	for {
		select {
		case <-r.stop:
			r.mu.Lock()
			for _, rv := range r.queue {
				rv.res <- reserveResult{err: fmt.Errorf("pgstore: reserve %s: %w", rv.op.Key, idemstore.ErrClosed)}
			}
			r.queue = nil
			r.mu.Unlock()
			return
		case <-r.wake:
		}
		for {
			r.mu.Lock()
			n := min(len(r.queue), reserveBatchMax)
			group := r.queue[:n:n]
			r.queue = r.queue[n:]
			r.sending = n
			r.mu.Unlock()
			if n == 0 {
				break
			}
			r.send(group)
			r.mu.Lock()
			r.sending = 0
			r.mu.Unlock()
		}
	}
}

// send runs a group and answers each of its callers.
func (r *reserver) send(group []*reservation) {
	live := group[:0:0]
	for _, rv := range group {
		if rv.ctx.Err() != nil || !rv.state.CompareAndSwap(rvQueued, rvSent) {
			continue // its caller left: nothing sent for it
		}
		live = append(live, rv)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(r.base, reserveTimeout)
	defer cancel()
	var waiting atomic.Int32
	waiting.Store(int32(len(live)))
	for _, rv := range live {
		stop := context.AfterFunc(rv.ctx, func() {
			if waiting.Add(-1) == 0 {
				cancel() // every caller left
			}
		})
		defer stop()
	}
	conn, err := r.pool.Acquire(ctx)
	if err != nil { // nothing sent
		for _, rv := range live {
			rv.res <- reserveResult{alone: true}
		}
		return
	}
	defer conn.Release()
	var results []reserveResult
	if len(live) == 1 {
		results, err = r.one(ctx, conn, live[0])
	} else {
		results, err = r.many(ctx, conn, live)
	}
	if err != nil {
		doubt := maybeSent(err)
		for _, rv := range live {
			rv.res <- reserveResult{alone: true, doubt: doubt}
		}
		return
	}
	for i, rv := range live {
		rv.res <- results[i]
	}
}

// one runs a group of one: reserve's statement.
func (r *reserver) one(ctx context.Context, conn *pgxpool.Conn, rv *reservation) ([]reserveResult, error) {
	var rw row
	var created bool
	res := make([]reserveResult, 1)
	err := conn.QueryRow(ctx, r.store.q.reserve, rv.args...).Scan(append(rw.dest(), &created)...)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		res[0].alone = true // lost a race to a row committed after the snapshot
	case err != nil:
		return nil, err
	default:
		res[0].rec, res[0].created, res[0].err = r.store.reserved(rv.op, rv.id, &rw, created)
	}
	return res, nil
}

// many runs a group as one statement (reserveMany), one implicit
// transaction: every row is committed once it answered. A reservation
// the statement returns no row for lost a race and runs alone.
func (r *reserver) many(ctx context.Context, conn *pgxpool.Conn, live []*reservation) ([]reserveResult, error) {
	res := make([]reserveResult, len(live))
	for i := range res {
		res[i].alone = true
	}
	b := &pgx.Batch{}
	b.Queue(byIndex)
	b.Queue(r.store.q.reserveMany, columnArrays(live)...)
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var (
		i       int64
		rw      row
		created bool
	)
	dest := append(append([]any{&i}, rw.dest()...), &created)
	var bad error
	for rows.Next() {
		rw = row{}
		if err := rows.Scan(dest...); err != nil {
			bad = cmp.Or(bad, err)
			continue
		}
		if i < 1 || i > int64(len(live)) || !res[i-1].alone {
			bad = cmp.Or(bad, fmt.Errorf("pgstore: reserve: a row for reservation %d of %d", i, len(live)))
			continue
		}
		rv := live[i-1]
		res[i-1] = reserveResult{}
		res[i-1].rec, res[i-1].created, res[i-1].err = r.store.reserved(rv.op, rv.id, &rw, created)
	}
	rows.Close()
	// Close reads up to the end of the transaction: only now is the
	// group committed.
	if err := cmp.Or(rows.Err(), bad, br.Close()); err != nil {
		return nil, err
	}
	return res, nil
}

// columnArrays returns reserveMany's arguments for group: for each column,
// the array of the reservations' values (reserve's arguments), in group's
// order.
func columnArrays(group []*reservation) []any {
	out := make([]any, len(columns))
	for c, name := range columns {
		switch colTypes[name] {
		case "text":
			if name == "name" { // NULL when unnamed
				a := make([]*string, len(group))
				for i, rv := range group {
					if s, ok := rv.args[c].(string); ok {
						a[i] = &s
					}
				}
				out[c] = a
				continue
			}
			out[c] = column[string](group, c)
		case "smallint":
			a := make([]int16, len(group))
			for i, rv := range group {
				switch v := rv.args[c].(type) {
				case int16:
					a[i] = v
				case int:
					a[i] = int16(v)
				}
			}
			out[c] = a
		case "integer":
			out[c] = column[int32](group, c)
		case "bigint":
			out[c] = column[int64](group, c)
		case "boolean":
			out[c] = column[bool](group, c)
		case "bytea":
			out[c] = column[[]byte](group, c)
		case "jsonb":
			a := make([]*string, len(group)) // NULL: no history
			for i, rv := range group {
				if s, ok := rv.args[c].(string); ok {
					a[i] = &s
				}
			}
			out[c] = a
		}
	}
	return out
}

// column is column c of group's arguments.
func column[T any](group []*reservation, c int) []T {
	a := make([]T, len(group))
	for i, rv := range group {
		a[i], _ = rv.args[c].(T)
	}
	return a
}

// close stops the goroutine once its group in flight ended (or ctx did);
// queued reservations fail with ErrClosed.
func (r *reserver) close(ctx context.Context) {
	r.mu.Lock()
	close(r.stop)
	r.mu.Unlock()
	select {
	case <-r.done:
	case <-ctx.Done():
	}
}

// wait waits for the goroutine to return, once base was cancelled.
func (r *reserver) wait() { <-r.done }
