package pgstore

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/idemstore"
)

// mark is an Attempt or Finish: one statement and its arguments.
type mark struct {
	what, key, sql string
	owner          string // the mark's owner (idemstore.Attempt.Owner): "" marks any row
	args           []any
	text           int  // index in args of the free text, repaired if PostgreSQL refuses the mark
	repaired       bool // its text was replaced once already
}

// Bounds of writing marks.
const (
	markRetryMin   = 10 * time.Millisecond
	markRetryMax   = time.Second
	markBatch      = 256              // marks per batch, one round trip and one transaction
	markTryTimeout = 10 * time.Second // one try of a batch
	// markWait bounds how long Attempt and Finish wait for their mark's
	// commit when the caller's context has no earlier deadline; after it,
	// the mark is accepted and written in the background.
	markWait = 2 * time.Second
)

// States of a queued mark.
const (
	markWaiting int32 = iota // its caller waits for it
	markLeft                 // its caller returned before it was written: accepted
	markDone                 // written, or dropped
)

// queuedMark is a mark in the writer's queue.
type queuedMark struct {
	mark
	state    atomic.Int32
	done     chan struct{} // closed when written, dropped, or its first try failed
	released bool          // done is closed; only the writer touches it
	err      error         // the result once written: nil, or ErrNotFound; set before state becomes markDone
}

// markWriter is the group commit of Attempt and Finish, and their queue
// while PostgreSQL does not take them. One goroutine writes every mark
// queued while its last batch ran as one pipeline, one transaction,
// committed asynchronously; marks stay in their order, so a Finish is
// never written before the Attempt made before it. A caller waits for its
// mark's commit, but not longer than its context, markWait, or the first
// failed try: the mark is then accepted (its call returns nil) and the
// writer writes it again, with a growing delay, until PostgreSQL takes it.
// While accepted marks wait, every other call of the store waits for them
// first (ready), within its own context, so that a read sees them and a
// later change applies after them.
//
// A mark PostgreSQL refuses for its content (SQLSTATE class 22 or 23) is
// never tried again as it is: its text is replaced once, and if it is
// refused again it is dropped and reported, so that one bad mark cannot
// hold back every other.
type markWriter struct {
	pool    *pgxpool.Pool
	log     *slog.Logger
	present string          // queries.present
	base    context.Context // ends when the store gives up on PostgreSQL at Close

	mu       sync.Mutex
	queue    []*queuedMark
	queued   uint64        // marks ever queued
	taken    uint64        // marks taken off the queue: written or dropped
	progress chan struct{} // closed and replaced whenever taken grows
	failed   chan struct{} // closed and replaced whenever a try fails
	lastErr  error         // the error of the last failed try
	stopped  bool

	left  atomic.Int64 // marks accepted whose callers returned before they were written
	wake  chan struct{}
	hurry chan struct{} // cuts a retry delay short: a caller waits for the queue
	stop  chan struct{}
	done  chan struct{}
}

func newMarkWriter(pool *pgxpool.Pool, base context.Context, log *slog.Logger, present string) *markWriter {
	w := &markWriter{pool: pool, base: base, log: log, present: present, progress: make(chan struct{}), failed: make(chan struct{}),
		wake: make(chan struct{}, 1), hurry: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// write queues m and waits for it as the type says. It returns nil once m
// is written or accepted, an error matching idemstore.ErrNotFound for a key
// with no record, and one matching idemstore.ErrClosed after close.
func (w *markWriter) write(ctx context.Context, m mark) error {
	q := &queuedMark{mark: m, done: make(chan struct{})}
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return fmt.Errorf("pgstore: %s %s: %w", m.what, m.key, idemstore.ErrClosed)
	}
	w.queue = append(w.queue, q)
	w.queued++
	w.mu.Unlock()
	signal(w.wake)
	t := time.NewTimer(markWait)
	select {
	case <-q.done:
	case <-ctx.Done():
	case <-t.C:
	}
	t.Stop()
	if q.state.CompareAndSwap(markWaiting, markLeft) {
		w.left.Add(1)
		return nil // accepted: the writer writes it
	}
	return q.err
}

// ready waits, within ctx, until every mark accepted before it is
// written. It has the writer try at once, and fails as soon as a try
// fails: PostgreSQL does not take changes now.
func (w *markWriter) ready(ctx context.Context) error {
	if w.left.Load() == 0 {
		return nil
	}
	w.mu.Lock()
	target := w.queued
	w.mu.Unlock()
	for {
		w.mu.Lock()
		taken, progress, failed, n := w.taken, w.progress, w.failed, len(w.queue)
		w.mu.Unlock()
		if taken >= target {
			return nil
		}
		signal(w.hurry)
		select {
		case <-progress:
		case <-failed:
			w.mu.Lock()
			err := w.lastErr
			w.mu.Unlock()
			return fmt.Errorf("pgstore: %d accepted changes not yet written: %w: %w", n, idemstore.ErrJournalWrite, err)
		case <-ctx.Done():
			return fmt.Errorf("pgstore: %d accepted changes not yet written: %w: %w", n, idemstore.ErrJournalWrite, context.Cause(ctx))
		}
	}
}

// run writes the queue in batches until stop.
func (w *markWriter) run() {
	defer close(w.done)
	delay := markRetryMin
	for {
		w.mu.Lock()
		n := min(len(w.queue), markBatch)
		batch := slices.Clone(w.queue[:n])
		w.mu.Unlock()
		if n == 0 {
			select {
			case <-w.stop:
				return
			case <-w.wake:
			}
			continue
		}
		err := w.send(batch)
		if err == nil {
			delay = markRetryMin
			continue
		}
		for _, q := range batch {
			q.release() // their callers return: accepted
		}
		w.mu.Lock()
		w.lastErr = err
		close(w.failed)
		w.failed = make(chan struct{})
		w.mu.Unlock()
		t := time.NewTimer(delay)
		select {
		case <-w.stop:
			t.Stop()
			return
		case <-w.hurry:
		case <-t.C:
		}
		t.Stop()
		delay = min(2*delay, markRetryMax)
	}
}

// release lets q's caller return; only the writer calls it.
func (q *queuedMark) release() {
	if !q.released {
		q.released = true
		close(q.done)
	}
}

// send writes batch, the head of the queue, as one transaction. It
// returns nil when the writer made progress: the batch was written, or
// the mark PostgreSQL refused was repaired or dropped.
func (w *markWriter) send(batch []*queuedMark) error {
	ctx, cancel := context.WithTimeout(w.base, markTryTimeout)
	defer cancel()
	b := &pgx.Batch{}
	for _, q := range batch {
		b.Queue(q.sql, q.args...)
	}
	br := w.pool.SendBatch(ctx, b)
	results := make([]error, len(batch))
	bad, badErr := -1, error(nil)
	for i, q := range batch {
		tag, err := br.Exec()
		switch {
		case err != nil:
			if bad < 0 {
				bad, badErr = i, err
			}
		case tag.RowsAffected() == 0: // a mark for a key that is gone changes nothing
			results[i] = fmt.Errorf("pgstore: %s %s: %w", q.what, q.key, idemstore.ErrNotFound)
		}
	}
	cerr := br.Close()
	switch {
	case bad < 0 && cerr == nil:
		w.unheld(ctx, batch, results)
		w.take(batch, results)
		return nil
	case bad >= 0 && permanent(badErr):
		w.refused(batch[bad], badErr)
		return nil
	case bad >= 0:
		return badErr
	}
	return cerr
}

// unheld sorts out the marks of batch, written, that changed nothing
// (results[i] matches idemstore.ErrNotFound): a mark with an owner whose row
// exists changed nothing because the owner lost it (another owner took
// it, or it was finished): not an error (idemstore.KeyStore.Attempt), logged
// at Info. If the check itself fails, such marks are taken as unheld too:
// their change is refused by the row either way.
func (w *markWriter) unheld(ctx context.Context, batch []*queuedMark, results []error) {
	var keys []string
	for i, q := range batch {
		if results[i] != nil && q.owner != "" {
			keys = append(keys, q.key)
		}
	}
	if len(keys) == 0 {
		return
	}
	present := map[string]bool{}
	rows, err := w.pool.Query(ctx, w.present, keys)
	if err == nil {
		var k string
		_, err = pgx.ForEachRow(rows, []any{&k}, func() error {
			present[k] = true
			return nil
		})
	}
	for i, q := range batch {
		if results[i] == nil || q.owner == "" || err == nil && !present[q.key] {
			continue
		}
		results[i] = nil
		if err != nil {
			w.log.Info("pgstore: a mark changed nothing: its row is gone, or its owner lost it", "idem.key", q.key, "mark", q.what, "idem.owner", q.owner, "err", err)
			continue
		}
		w.log.Info("pgstore: a mark changed nothing: its owner lost the operation (another owner holds it, or it is finished)", "idem.key", q.key, "mark", q.what, "idem.owner", q.owner)
	}
}

// take removes batch, written, from the head of the queue and answers its
// callers.
func (w *markWriter) take(batch []*queuedMark, results []error) {
	w.mu.Lock()
	w.queue = w.queue[len(batch):]
	w.taken += uint64(len(batch))
	close(w.progress)
	w.progress = make(chan struct{})
	w.mu.Unlock()
	for i, q := range batch {
		q.finish(w, results[i])
	}
}

func (q *queuedMark) finish(w *markWriter, err error) {
	q.err = err
	if !q.state.CompareAndSwap(markWaiting, markDone) {
		q.state.Store(markDone)
		w.left.Add(-1)
	}
	q.release()
}

// refused deals with a mark PostgreSQL refused for its content: its text
// is replaced the first time; the second time it is dropped and
// reported. A dropped Finish leaves its operation pending, so Resume
// sends it again under its key and the provider replays its answer.
func (w *markWriter) refused(q *queuedMark, err error) {
	if q.text >= 0 && !q.repaired {
		q.repaired = true
		q.args[q.text] = fmt.Sprintf("(error text refused by PostgreSQL, SQLSTATE %s)", sqlState(err))
		w.log.Warn("pgstore: PostgreSQL refused a mark's text; writing it without", "idem.key", q.key, "mark", q.what, "err", err)
		return
	}
	w.mu.Lock()
	if i := slices.Index(w.queue, q); i >= 0 {
		w.queue = slices.Delete(w.queue, i, i+1)
		w.taken++
		close(w.progress)
		w.progress = make(chan struct{})
	}
	w.mu.Unlock()
	w.log.Error("pgstore: dropped a mark PostgreSQL refuses", "idem.key", q.key, "mark", q.what, "err", err)
	q.finish(w, fmt.Errorf("pgstore: %s %s: refused by PostgreSQL, dropped: %w: %w", q.what, q.key, idemstore.ErrJournalWrite, err))
}

// drain waits, within ctx, until the queue is empty, and returns an error
// matching idemstore.ErrJournalWrite if it is not. New marks are refused from
// now on.
func (w *markWriter) drain(ctx context.Context) error {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	for {
		w.mu.Lock()
		n, progress := len(w.queue), w.progress
		w.mu.Unlock()
		if n == 0 {
			return nil
		}
		signal(w.hurry)
		select {
		case <-progress:
		case <-ctx.Done():
			return fmt.Errorf("%d accepted changes not written: %w", n, idemstore.ErrJournalWrite)
		}
	}
}

// close stops the writer; the store has cancelled base, so a batch in
// flight ends at once.
func (w *markWriter) close() {
	close(w.stop)
	<-w.done
}
