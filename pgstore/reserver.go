package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem"
)

// Bounds of a group of reservations.
const (
	reserveBatchMax = 64
	// reserveBatchTimeout bounds one group's round trip; a caller whose
	// context ends sooner still waits for it, because its row may be
	// committed: the caller must not be told "not reserved" then.
	reserveBatchTimeout = 30 * time.Second
)

// reserver is Reserve's group commit: one goroutine sends every Reserve
// queued while its last group ran as one pipeline of statements, which
// PostgreSQL runs as one transaction: one round trip and one commit (one
// WAL flush) for the group, without a timer. At one call in flight a group
// is that call alone and costs what the statement alone costs; at 32 in
// flight, groups share the WAL flush that dominates a commit.
//
// A group is all or nothing. If it fails (the server is away, a deadlock
// with another replica's group on the same names), no row of it was
// written and each caller runs its own statement, as it would without
// groups, and gets its own error.
type reserver struct {
	pool  *pgxpool.Pool
	sql   string
	mu    sync.Mutex
	queue []*reservation
	wake  chan struct{}
	stop  chan struct{}
	done  chan struct{}
}

// reservation is one Reserve waiting for its group.
type reservation struct {
	ctx  context.Context
	op   idem.Operation
	args []any
	res  chan reserveResult // buffered
}

type reserveResult struct {
	rec     idem.Operation
	created bool
	err     error
	alone   bool // not decided by the group: run the statement alone
}

func newReserver(pool *pgxpool.Pool, sql string) *reserver {
	r := &reserver{pool: pool, sql: sql, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

// do queues a reservation and waits for its group's result.
func (r *reserver) do(ctx context.Context, op idem.Operation, args []any) reserveResult {
	rv := &reservation{ctx: ctx, op: op, args: args, res: make(chan reserveResult, 1)}
	r.mu.Lock()
	select {
	case <-r.stop:
		r.mu.Unlock()
		return reserveResult{err: fmt.Errorf("pgstore: reserve %s: %w", op.Key, idem.ErrClosed)}
	default:
	}
	r.queue = append(r.queue, rv)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return <-rv.res
}

func (r *reserver) run() {
	defer close(r.done)
	for {
		select {
		case <-r.stop:
			r.mu.Lock()
			for _, rv := range r.queue {
				rv.res <- reserveResult{err: fmt.Errorf("pgstore: reserve %s: %w", rv.op.Key, idem.ErrClosed)}
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
			r.mu.Unlock()
			if n == 0 {
				break
			}
			r.send(group)
		}
	}
}

// send runs a group and answers each of its callers.
func (r *reserver) send(group []*reservation) {
	live := group[:0:0]
	for _, rv := range group {
		if err := rv.ctx.Err(); err != nil {
			rv.res <- reserveResult{err: err} // nothing sent for it
			continue
		}
		live = append(live, rv)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), reserveBatchTimeout)
	defer cancel()
	b := &pgx.Batch{}
	for _, rv := range live {
		b.Queue(r.sql, rv.args...)
	}
	br := r.pool.SendBatch(ctx, b)
	results := make([]reserveResult, len(live))
	failed := false
	for i, rv := range live {
		var rw row
		var created bool
		err := br.QueryRow().Scan(append(rw.dest(), &created)...)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			results[i].alone = true // lost a race to a row committed after the snapshot
		case err != nil:
			failed = true
		default:
			results[i].rec, results[i].created, results[i].err = reserved(rv.op, &rw, created)
		}
	}
	// Close reads up to the end of the transaction: only now is the
	// group committed.
	if err := br.Close(); err != nil || failed {
		for _, rv := range live {
			rv.res <- reserveResult{alone: true}
		}
		return
	}
	for i, rv := range live {
		rv.res <- results[i]
	}
}

// close stops the goroutine; queued reservations fail with ErrClosed.
func (r *reserver) close() {
	r.mu.Lock()
	close(r.stop)
	r.mu.Unlock()
	<-r.done
}
