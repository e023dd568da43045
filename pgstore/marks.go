package pgstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// mark is an accepted Attempt or Finish: one statement and its arguments.
type mark struct {
	what, key, sql string
	args           []any
	result         error // set by a group: nil, or ErrNotFound
}

// Bounds of writing marks again.
const (
	markRetryMin   = 10 * time.Millisecond
	markRetryMax   = time.Second
	markBatch      = 256              // marks per batch, one round trip and one transaction
	markTryTimeout = 30 * time.Second // one try of a batch
	// closeFlushTimeout bounds how long Close tries to write the marks
	// still waiting before it gives up and reports them.
	closeFlushTimeout = 15 * time.Second
)

// marks holds, in order, the accepted marks that PostgreSQL has not taken
// yet (it was unreachable, or the connection broke), and writes them again
// in the background until it does. While any wait, every other call of the
// store writes them first (Store.ready), so a read sees them and a later
// change applies after them.
type marks struct {
	pool    *pgxpool.Pool
	mu      sync.Mutex
	queue   []mark
	n       atomic.Int64 // len(queue), read without mu
	flushMu sync.Mutex   // one writer at a time keeps marks in order
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

func newMarks(pool *pgxpool.Pool) *marks {
	q := &marks{pool: pool, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go q.run()
	return q
}

func (q *marks) waiting() bool { return q.n.Load() > 0 }

// add keeps m to be written in the background.
func (q *marks) add(m mark) {
	q.mu.Lock()
	q.queue = append(q.queue, m)
	q.n.Store(int64(len(q.queue)))
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// flush writes the waiting marks in order, in batches, and returns the
// first error. A batch is one transaction: on an error none of it is kept
// as written, and all of it is tried again later.
func (q *marks) flush(ctx context.Context) error {
	q.flushMu.Lock()
	defer q.flushMu.Unlock()
	for {
		q.mu.Lock()
		batch := q.queue[:min(len(q.queue), markBatch):min(len(q.queue), markBatch)]
		q.mu.Unlock()
		if len(batch) == 0 {
			return nil
		}
		b := &pgx.Batch{}
		for _, m := range batch {
			b.Queue(m.sql, m.args...) // a mark for a key that is gone changes nothing
		}
		if err := q.pool.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("%d marks waiting, first %s %s: %w", q.n.Load(), batch[0].what, batch[0].key, err)
		}
		q.mu.Lock()
		q.queue = q.queue[len(batch):]
		q.n.Store(int64(len(q.queue)))
		q.mu.Unlock()
	}
}

// run writes waiting marks whenever some are added, trying again with a
// growing delay while PostgreSQL does not take them, until close.
func (q *marks) run() {
	defer close(q.done)
	for {
		select {
		case <-q.stop:
			return
		case <-q.wake:
		}
		delay := markRetryMin
		for q.waiting() {
			ctx, cancel := context.WithTimeout(context.Background(), markTryTimeout)
			err := q.flush(ctx)
			cancel()
			if err == nil {
				break
			}
			t := time.NewTimer(delay)
			select {
			case <-q.stop:
				t.Stop()
				return
			case <-t.C:
			}
			delay = min(2*delay, markRetryMax)
		}
	}
}

// close stops the background writer and keeps trying to write what
// waits, for up to closeFlushTimeout.
func (q *marks) close() error {
	close(q.stop)
	<-q.done
	return retry(closeFlushTimeout, q.flush)
}

// retry calls fn until it succeeds or timeout passed, waiting a growing
// delay between calls, and returns its last error. A connection the server
// closed while idle in the pool fails once and is dropped, so a few tries
// get past a server restart.
func retry(timeout time.Duration, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	delay := markRetryMin
	for {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		delay = min(2*delay, markRetryMax)
	}
}

// mark writes m with the marks of other calls made at the same moment,
// in one round trip and one asynchronous commit, unless marks wait
// already: then, or if PostgreSQL does not take the group, it waits its
// turn in the background. Either way the change is accepted. Only a key
// with no record is refused, with idem.ErrNotFound.
func (s *Store) mark(m mark) error {
	if s.marks.waiting() || !s.markGroups.do(&m) {
		// The group may or may not have committed (a connection that broke
		// after the commit): writing it again may count an attempt twice,
		// which is better than losing a finish.
		m.result = nil
		s.marks.add(m)
		return nil
	}
	return m.result
}
