package pgstore

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
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
	// many, when set, is the statement that writes several marks of
	// this kind, each of another key, in one: it takes, for each of
	// args's places, the array of the marks' values, and returns the keys
	// it changed.
	many     string
	owner    string // the mark's owner (idemstore.Attempt.Owner): "" marks any row
	args     []any
	text     int  // index in args of the free text, repaired if PostgreSQL refuses the mark
	repaired bool // its text was replaced once already
}

// Bounds of writing marks.
const (
	markRetryMin   = 10 * time.Millisecond
	markRetryMax   = time.Second
	markBatch      = 256              // marks per batch, one round trip and one transaction
	markTryTimeout = 10 * time.Second // one try of a batch
	// markLockTimeout bounds how long a batch waits for a row lock that
	// another transaction holds (lock_timeout, for the batch only): that
	// row's mark is then set aside, with its operation's later marks, and
	// written on its own, while the marks of other operations go on.
	markLockTimeout = 250 * time.Millisecond
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
	seq      uint64 // its place among the marks ever queued
	state    atomic.Int32
	done     chan struct{} // closed when written, dropped, set aside, or its first try failed
	released sync.Once     // closes done
	err      error         // the result once written: nil, or ErrNotFound; set before state becomes markDone
}

// markWriter is the group commit of Attempt and Finish, and their queue
// while PostgreSQL does not take them. One goroutine writes every mark
// queued while its last batch ran as one pipeline, one transaction,
// committed asynchronously (consecutive marks with a statement of several
// rows, finishes of distinct keys, as one statement: mark.many); marks
// stay in their order, so a Finish is
// never written before the Attempt made before it. A caller waits for its
// mark's commit, but not longer than its context, markWait, or the first
// failed try: the mark is then accepted (its call returns nil) and the
// writer writes it again, with a growing delay, until PostgreSQL takes it.
// While accepted marks wait, every other call of the store waits for them
// first (ready), within its own context, so that a read sees them and a
// later change applies after them.
//
// A row another transaction holds locked (an operator's session, a long
// transaction, a role's statement_timeout) slows only its own operation:
// a batch waits for a row lock at most markLockTimeout, and the mark that
// waited is set aside with every later mark of its operation, its caller
// answered (accepted), and the batch is sent again without it. Marks set
// aside are written, per operation and in order, by a goroutine of their
// own, again and again with a growing delay, until PostgreSQL takes them;
// they hold up neither the queue nor ready. Until then the operation's row
// stays as it was — pending, in doubt — for every reader: nothing reports
// it finished before its mark is written.
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

	mu    sync.Mutex
	queue []*queuedMark // in seq order
	// held are the marks set aside, per key, in order; nheld counts them.
	held     map[string][]*queuedMark
	nheld    int
	queued   uint64        // marks ever queued: the seq of the last
	progress chan struct{} // closed and replaced whenever a mark leaves the queue or held
	failed   chan struct{} // closed and replaced whenever a try fails
	lastErr  error         // the error of the last failed try
	stopped  bool

	left      atomic.Int64 // marks accepted whose callers returned before they were written
	wake      chan struct{}
	hurry     chan struct{} // cuts a retry delay short: a caller waits for the queue
	wakeHeld  chan struct{} // marks were set aside, or Close waits for them
	stop      chan struct{}
	writers   sync.WaitGroup
	lockAfter string // markLockTimeout, as lock_timeout takes it
}

func newMarkWriter(pool *pgxpool.Pool, base context.Context, log *slog.Logger, present string) *markWriter {
	w := &markWriter{pool: pool, base: base, log: log, present: present, progress: make(chan struct{}), failed: make(chan struct{}),
		held: map[string][]*queuedMark{}, wake: make(chan struct{}, 1), hurry: make(chan struct{}, 1), wakeHeld: make(chan struct{}, 1),
		stop: make(chan struct{}), lockAfter: fmt.Sprintf("%dms", markLockTimeout.Milliseconds())}
	w.writers.Go(w.run)
	w.writers.Go(w.runHeld)
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
	w.queued++
	q.seq = w.queued
	if held, ok := w.held[m.key]; ok {
		// Its operation's earlier mark waits for a row lock: this one
		// waits behind it, accepted at once.
		w.held[m.key] = append(held, q)
		w.nheld++
		w.mu.Unlock()
		q.release()
		signal(w.wakeHeld)
	} else {
		w.queue = append(w.queue, q)
		w.mu.Unlock()
		signal(w.wake)
	}
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
// written, or set aside (see markWriter). It has the writer try at once,
// and fails as soon as a try fails: PostgreSQL does not take changes now.
func (w *markWriter) ready(ctx context.Context) error {
	if w.left.Load() == 0 {
		return nil
	}
	w.mu.Lock()
	target := w.queued
	w.mu.Unlock()
	for {
		w.mu.Lock()
		waiting := len(w.queue) > 0 && w.queue[0].seq <= target
		progress, failed, n := w.progress, w.failed, len(w.queue)
		w.mu.Unlock()
		if !waiting {
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

// release lets q's caller return.
func (q *queuedMark) release() {
	q.released.Do(func() { close(q.done) })
}

// send writes batch, the head of the queue, as one transaction. It
// returns nil when the writer made progress: the batch was written, the
// mark PostgreSQL refused was repaired or dropped, or the mark whose row
// another transaction holds was set aside.
func (w *markWriter) send(batch []*queuedMark) error {
	ctx, cancel := context.WithTimeout(w.base, markTryTimeout)
	defer cancel()
	results, bad, err := w.exec(ctx, batch, true)
	if err != nil && bad < 0 && (permanent(err) || blocked(ctx, err)) {
		// A statement of several marks failed for one of them: find
		// which, one statement per mark.
		results, bad, err = w.exec(ctx, batch, false)
	}
	switch {
	case err == nil:
		w.unheld(ctx, batch, results)
		w.take(batch, results)
		return nil
	case bad >= 0 && permanent(err):
		w.refused(batch[bad], err)
		return nil
	case bad >= 0 && blocked(ctx, err):
		w.setAside(batch[bad], err)
		return nil
	}
	return err
}

// exec writes batch as one transaction whose row lock waits last at most
// markLockTimeout. With many, consecutive marks that have a statement for
// several (mark.many) and distinct keys are written by one statement. It
// returns each mark's result (nil, or an error matching
// idemstore.ErrNotFound for a mark that changed nothing), or the error of
// the try and, when PostgreSQL refused a statement of one mark, its index
// in batch (-1 otherwise: a statement of several that failed does not
// say for which).
func (w *markWriter) exec(ctx context.Context, batch []*queuedMark, many bool) ([]error, int, error) {
	b := &pgx.Batch{}
	lock := `SELECT set_config('lock_timeout', $1, true)`
	if many {
		lock = byIndex + `, set_config('lock_timeout', $1, true)`
	}
	b.Queue(lock, w.lockAfter)
	var runs [][]*queuedMark // the batch, by statement, in order
	for i := 0; i < len(batch); {
		n := 1
		if many {
			n = manyRun(batch[i:])
		}
		var arrays []any
		if n > 1 {
			if arrays = markArrays(batch[i : i+n]); arrays == nil {
				n = 1
			}
		}
		run := batch[i : i+n]
		runs = append(runs, run)
		if n == 1 {
			b.Queue(run[0].sql, run[0].args...)
		} else {
			b.Queue(run[0].many, arrays...)
		}
		i += n
	}
	br := w.pool.SendBatch(ctx, b)
	results := make([]error, len(batch))
	notFound := func(q *queuedMark) error {
		return fmt.Errorf("pgstore: %s %s: %w", q.what, q.key, idemstore.ErrNotFound)
	}
	_, badErr := br.Exec()
	bad := -1
	i := 0
	for _, run := range runs {
		if len(run) == 1 {
			tag, err := br.Exec()
			switch {
			case err != nil:
				if badErr == nil {
					bad, badErr = i, err
				}
			case tag.RowsAffected() == 0: // a mark for a key that is gone changes nothing
				results[i] = notFound(run[0])
			}
			i++
			continue
		}
		changed := map[string]bool{}
		rows, err := br.Query()
		if err == nil {
			var k string
			_, err = pgx.ForEachRow(rows, []any{&k}, func() error {
				changed[k] = true
				return nil
			})
		}
		for _, q := range run {
			if err == nil && !changed[q.key] {
				results[i] = notFound(q)
			}
			i++
		}
		badErr = cmp.Or(badErr, err)
	}
	cerr := br.Close()
	switch {
	case badErr != nil:
		return nil, bad, badErr
	case cerr != nil:
		return nil, -1, cerr
	}
	return results, -1, nil
}

// manyRun is how many marks at the head of batch one statement writes:
// the head's run of marks with the same statement for several, each of
// another key; 1 when the head has none.
func manyRun(batch []*queuedMark) int {
	if batch[0].many == "" {
		return 1
	}
	keys := map[string]bool{}
	n := 0
	for _, q := range batch {
		if q.many != batch[0].many || keys[q.key] {
			break
		}
		keys[q.key] = true
		n++
	}
	return n
}

// markArrays returns the arguments of run's statement for several: for
// each of a mark's arguments, the array of the marks' values; nil if an
// argument has a type it does not know.
func markArrays(run []*queuedMark) []any {
	out := make([]any, len(run[0].args))
	for c, v := range run[0].args {
		switch v.(type) {
		case string:
			out[c] = markColumn[string](run, c)
		case int16:
			out[c] = markColumn[int16](run, c)
		case int32:
			out[c] = markColumn[int32](run, c)
		case int64:
			out[c] = markColumn[int64](run, c)
		default:
			return nil
		}
	}
	return out
}

func markColumn[T any](run []*queuedMark, c int) []T {
	a := make([]T, len(run))
	for i, q := range run {
		a[i], _ = q.args[c].(T)
	}
	return a
}

// blocked reports whether a mark failed with err because its row was
// held by another transaction longer than the batch may wait: a lock
// timeout, a deadlock, or a statement timeout of the server's (not the
// end of the try's own context, ctx).
func blocked(ctx context.Context, err error) bool {
	switch sqlState(err) {
	case "55P03", "40P01": // lock_not_available, deadlock_detected
		return true
	case "57014": // query_canceled: statement_timeout, unless the try's own deadline cancelled it
		return ctx.Err() == nil
	}
	return false
}

// setAside moves q, whose row another transaction holds, and every later
// mark of its operation from the queue to held, and lets their callers
// return (accepted). The marks of other operations go on without them.
func (w *markWriter) setAside(q *queuedMark, err error) {
	w.mu.Lock()
	moved := []*queuedMark{}
	keep := make([]*queuedMark, 0, len(w.queue))
	for _, x := range w.queue {
		if x.key == q.key {
			moved = append(moved, x)
		} else {
			keep = append(keep, x)
		}
	}
	w.queue = keep
	w.held[q.key] = append(w.held[q.key], moved...)
	w.nheld += len(moved)
	close(w.progress)
	w.progress = make(chan struct{})
	w.mu.Unlock()
	for _, x := range moved {
		x.release()
	}
	w.log.Warn("pgstore: a mark waits for a row another transaction holds; the operation stays pending until it is written",
		"idem.key", q.key, "mark", q.what, "marks", len(moved), "err", err)
	signal(w.wakeHeld)
}

// runHeld writes the marks set aside until stop: each operation's in
// order, on its own, every time again after a growing delay until
// PostgreSQL takes them.
func (w *markWriter) runHeld() {
	delay := markRetryMin
	for {
		w.mu.Lock()
		n := w.nheld
		w.mu.Unlock()
		var due <-chan time.Time
		t := time.NewTimer(delay)
		if n > 0 {
			due = t.C
		}
		select {
		case <-w.stop:
			t.Stop()
			return
		case <-w.wakeHeld:
		case <-due:
		}
		t.Stop()
		if n == 0 {
			continue // marks were just set aside: try them after a delay
		}
		w.mu.Lock()
		keys := slices.Sorted(maps.Keys(w.held))
		w.mu.Unlock()
		moved := true
		for _, k := range keys {
			w.mu.Lock()
			hs := w.held[k]
			batch := slices.Clone(hs[:min(len(hs), markBatch)])
			w.mu.Unlock()
			if len(batch) > 0 && !w.sendHeld(k, batch) {
				moved = false
			}
		}
		if moved {
			delay = markRetryMin
		} else {
			delay = min(2*delay, markRetryMax)
		}
	}
}

// sendHeld writes batch, the head of key's marks set aside, as one
// transaction, and reports whether it made progress.
func (w *markWriter) sendHeld(key string, batch []*queuedMark) bool {
	ctx, cancel := context.WithTimeout(w.base, markTryTimeout)
	defer cancel()
	results, bad, err := w.exec(ctx, batch, false)
	switch {
	case err == nil:
		w.unheld(ctx, batch, results)
		w.mu.Lock()
		if rest := w.held[key][len(batch):]; len(rest) > 0 {
			w.held[key] = rest
		} else {
			delete(w.held, key)
		}
		w.nheld -= len(batch)
		close(w.progress)
		w.progress = make(chan struct{})
		w.mu.Unlock()
		for i, q := range batch {
			q.finish(w, results[i])
		}
		w.log.Info("pgstore: a mark that waited for a row lock is written", "idem.key", key, "marks", len(batch))
		return true
	case bad >= 0 && permanent(err):
		w.refused(batch[bad], err)
		return true
	}
	return false
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
	} else if hs := w.held[q.key]; slices.Contains(hs, q) {
		i := slices.Index(hs, q)
		if hs = slices.Delete(hs, i, i+1); len(hs) > 0 {
			w.held[q.key] = hs
		} else {
			delete(w.held, q.key)
		}
		w.nheld--
	}
	close(w.progress)
	w.progress = make(chan struct{})
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
		n, progress := len(w.queue)+w.nheld, w.progress
		w.mu.Unlock()
		if n == 0 {
			return nil
		}
		signal(w.hurry)
		signal(w.wakeHeld)
		select {
		case <-progress:
		case <-ctx.Done():
			return fmt.Errorf("%d accepted changes not written: %w", n, idemstore.ErrJournalWrite)
		}
	}
}

// close stops the writers; the store has cancelled base, so a batch in
// flight ends at once.
func (w *markWriter) close() {
	close(w.stop)
	w.writers.Wait()
}
