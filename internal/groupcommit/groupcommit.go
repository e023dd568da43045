// Package groupcommit commits the writes of many goroutines together: one
// transaction, and so one fsync, per group.
//
// A Writer runs one goroutine. Each commit takes everything that was queued
// while the previous commit ran (up to a cap), so a lone caller is committed
// at once and a crowd shares fsyncs. Nobody who waits for durability waits
// for a group to fill. Functions queued with Go, whose callers do not wait,
// ride the next commit that someone waits for; if none comes within
// Options.AsyncDelay, they are committed on their own.
//
// The functions of a group run in queue order inside one transaction. If one
// of them returns an error (or panics), the transaction is rolled back and
// the group is run again without it, so one caller's failure never fails the
// others. Because of this a function MAY BE CALLED MORE THAN ONCE and must
// only derive its effects from the transaction it is given. If the commit
// itself fails (a full disk, an I/O error), every caller of Do in the group
// gets that error, and the functions queued by Go are kept, in order, at
// the head of the queue: they ride the next commit, retried after a delay
// that doubles up to MaxRetryDelay while commits keep failing. An accepted
// asynchronous change is never dropped while the Writer is open; Close makes
// one last attempt and returns its error.
package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ErrClosed is returned by Do, Go and Sync after Close was called.
var ErrClosed = errors.New("groupcommit: writer closed")

// Options tune a Writer. The zero value is usable.
type Options struct {
	// MaxGroup caps the number of functions one transaction runs. Zero
	// means 1024.
	MaxGroup int
	// OnAsyncError is called, on the writer's goroutine, with the error of a
	// function queued by Go (which is then dropped: it failed, not the
	// disk), or once per failed commit that carried functions queued by Go
	// (which are kept for the next commit). Nil ignores such errors.
	OnAsyncError func(error)
	// OnCommit, if set, is called on the writer's goroutine after every
	// commit with the number of functions it carried, how long it took and
	// its error. It must not block.
	OnCommit func(n int, d time.Duration, err error)
	// Recover, if set, turns the value a function panicked with into the
	// error that function gets. Nil gives a generic error.
	Recover func(p any) error
	// MaxRetryDelay caps the wait before functions queued by Go are
	// committed again after their commit failed. Zero means 1s.
	MaxRetryDelay time.Duration
	// AsyncDelay is how long functions queued by Go may wait for a Do or
	// Sync to carry them into a commit before they are committed on their
	// own. It saves an fsync per request for callers that follow every
	// durable write with an asynchronous one. Zero means 20ms; a negative
	// value commits them at once.
	AsyncDelay time.Duration
}

// A Writer queues functions and runs them in group transactions. It is safe
// for concurrent use. T is the transaction type (for bbolt, *bbolt.Tx).
type Writer[T any] struct {
	update     func(func(T) error) error
	maxGroup   int
	onAsync    func(error)
	onCommit   func(int, time.Duration, error)
	asyncDelay time.Duration
	maxRetry   time.Duration
	recover    func(any) error

	items   sync.Pool // of *item[T] with a result channel, for Do
	goItems sync.Pool // of *item[T] without, for Go; the writer returns them

	// Used by the writer goroutine only, for the group it runs.
	live      []*item[T]
	running   []*item[T]
	failed    int
	failErrFn error
	runFn     func(T) error // w.runGroup

	mu      sync.Mutex
	cond    *sync.Cond // signalled when queue grows or closed is set
	queue   []*item[T]
	closed  bool
	urgent  int           // queued Do functions
	syncers int           // Sync callers waiting
	due     bool          // the async delay of the queued Go functions is over
	timer   *time.Timer   // runs out the async delay; nil when not running
	timerN  uint64        // counts timers started or stopped; a stale one is ignored
	enq     uint64        // functions ever queued
	done    uint64        // functions ever finished, in queue order
	flushed chan struct{} // closed after the next group; nil until a Sync waits
	exited  chan struct{}
	failErr error  // error of the last failed commit that kept functions queued
	fails   int    // commits failed in a row
	failN   uint64 // commits ever failed that kept functions queued
	lost    error  // the error that made Close drop queued functions
}

type item[T any] struct {
	fn    func(T) error
	state atomic.Int32
	res   chan error // nil for Go
}

const (
	queued int32 = iota
	taken
	cancelled
)

// errRerun marks the rollback of a group because one function failed.
var errRerun = errors.New("groupcommit: rerun group")

// New starts a Writer whose commits call update, which must run its
// argument in one read-write transaction, commit it durably and return the
// argument's error or the commit's error (bbolt's DB.Update does this).
// Close stops it.
func New[T any](update func(func(T) error) error, o Options) *Writer[T] {
	w := &Writer[T]{
		update:     update,
		maxGroup:   o.MaxGroup,
		onAsync:    o.OnAsyncError,
		onCommit:   o.OnCommit,
		asyncDelay: o.AsyncDelay,
		exited:     make(chan struct{}),
	}
	if w.maxGroup <= 0 {
		w.maxGroup = 1024
	}
	if w.asyncDelay == 0 {
		w.asyncDelay = 20 * time.Millisecond
	}
	w.recover = o.Recover
	w.maxRetry = o.MaxRetryDelay
	if w.maxRetry <= 0 {
		w.maxRetry = time.Second
	}
	w.runFn = w.runGroup
	w.cond = sync.NewCond(&w.mu)
	go w.loop()
	return w
}

// Do queues fn and waits until the group that ran it has committed. It
// returns fn's error, or the commit's error, or nil once fn's effects are
// durable. If ctx ends while fn is still queued, fn is dropped and Do
// returns the context's cause; once fn's group has started, Do waits for it.
func (w *Writer[T]) Do(ctx context.Context, fn func(T) error) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	// Items of Do, with their channel, are reused: the writer is done
	// with an item once it has sent the result.
	it, _ := w.items.Get().(*item[T])
	if it == nil {
		it = &item[T]{res: make(chan error, 1)}
	}
	it.fn = fn
	it.state.Store(queued)
	if err := w.push(it); err != nil {
		return err
	}
	var err error
	select {
	case err = <-it.res:
	case <-ctx.Done():
		if it.state.CompareAndSwap(queued, cancelled) {
			// The queue still holds it: not reusable.
			return context.Cause(ctx)
		}
		err = <-it.res
	}
	it.fn = nil
	w.items.Put(it)
	return err
}

// Go queues fn and returns at once. fn runs in the next group; its error,
// or that group's commit error, goes to Options.OnAsyncError.
func (w *Writer[T]) Go(fn func(T) error) error {
	it, _ := w.goItems.Get().(*item[T])
	if it == nil {
		it = &item[T]{}
	}
	it.fn = fn
	if err := w.push(it); err != nil {
		it.fn = nil
		w.goItems.Put(it)
		return err
	}
	return nil
}

// Sync waits until every function queued before it was called has run and
// its group has committed. It returns at once if nothing is queued or
// running, and returns the context's cause if ctx ends first.
func (w *Writer[T]) Sync(ctx context.Context) error {
	w.mu.Lock()
	if w.closed && w.enq == w.done {
		w.mu.Unlock()
		return ErrClosed
	}
	target, failN := w.enq, w.failN
	if w.done < target {
		w.syncers++
		w.cond.Signal()
		defer func() {
			w.mu.Lock()
			w.syncers--
			w.mu.Unlock()
		}()
	}
	for w.done < target {
		if w.flushed == nil {
			w.flushed = make(chan struct{})
		}
		ch := w.flushed
		w.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		w.mu.Lock()
		if w.done < target && w.failN != failN {
			// What Sync waits for is kept for a later commit.
			err := w.failErr
			w.mu.Unlock()
			return err
		}
	}
	w.mu.Unlock()
	return nil
}

// Close runs and commits everything queued, stops the goroutine and returns.
// Later calls of Do, Go and Sync return ErrClosed.
func (w *Writer[T]) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.exited
		return ErrClosed
	}
	w.closed = true
	w.cond.Signal()
	w.mu.Unlock()
	<-w.exited
	if w.lost != nil {
		return fmt.Errorf("groupcommit: queued changes not written: %w", w.lost)
	}
	return nil
}

func (w *Writer[T]) push(it *item[T]) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	w.queue = append(w.queue, it)
	w.enq++
	if it.res != nil {
		w.urgent++
	}
	w.cond.Signal()
	return nil
}

func (w *Writer[T]) loop() {
	defer close(w.exited)
	var group []*item[T]
	for {
		w.mu.Lock()
		for !w.ready() {
			w.cond.Wait()
		}
		if len(w.queue) == 0 {
			w.mu.Unlock()
			return
		}
		if w.timer != nil {
			w.timer.Stop()
			w.timer = nil
			w.timerN++ // a timer firing late must not mark the next wait due
		}
		w.due = false
		n := min(len(w.queue), w.maxGroup)
		for _, it := range w.queue[:n] {
			if it.res != nil {
				w.urgent--
			}
		}
		closing := w.closed // this group is Close's last attempt
		if n == len(w.queue) && cap(w.queue) <= w.maxGroup {
			// The common case: the group takes the whole queue. Swap the
			// two arrays instead of copying, so that a steady stream of
			// groups allocates no queue.
			group, w.queue = w.queue, group[:0]
		} else {
			group = append(group[:0], w.queue[:n]...)
			clear(w.queue[:n])
			w.queue = w.queue[n:]
			if len(w.queue) == 0 {
				w.queue = w.queue[:0:0] // let the old backing array go
			}
		}
		w.mu.Unlock()

		kept, err := w.run(group)
		clear(group)

		w.mu.Lock()
		w.done += uint64(n - len(kept))
		if len(kept) > 0 {
			if closing {
				// Close makes one last attempt; after it, nothing is left
				// to retry with.
				w.lost = fmt.Errorf("%d changes: %w", len(kept), err)
				w.done += uint64(len(kept))
			} else {
				w.queue = append(kept, w.queue...)
				w.failErr, w.fails, w.failN = err, w.fails+1, w.failN+1
			}
		} else if err == nil {
			w.fails = 0
		}
		if w.flushed != nil {
			close(w.flushed)
			w.flushed = nil
		}
		w.mu.Unlock()
	}
}

// ready reports whether the loop should commit now (or, with an empty
// queue, exit). While only Go functions are queued it starts the async
// delay's timer. w.mu is held.
func (w *Writer[T]) ready() bool {
	switch {
	case len(w.queue) == 0:
		return w.closed
	case w.closed, w.urgent > 0, w.due, len(w.queue) >= w.maxGroup:
		return true
	case w.fails == 0 && (w.syncers > 0 || w.asyncDelay < 0):
		// After a failed commit, a waiting Sync does not hurry the
		// retry: it returns the failure instead.
		return true
	}
	if w.timer == nil {
		w.timerN++
		n := w.timerN
		delay := max(w.asyncDelay, 0)
		if w.fails > 0 {
			// The last commit failed: wait before retrying what it kept,
			// doubling the wait with each failure.
			delay = min(max(delay, time.Millisecond)<<min(w.fails, 20), w.maxRetry)
		}
		w.timer = time.AfterFunc(delay, func() {
			w.mu.Lock()
			if n == w.timerN { // not stopped by a commit meanwhile
				w.due = true
				w.cond.Signal()
			}
			w.mu.Unlock()
		})
	}
	return false
}

// run commits one group, rerunning it without any function that fails. If
// the commit fails, it returns the functions queued by Go, to be kept, and
// the error.
func (w *Writer[T]) run(group []*item[T]) (kept []*item[T], err error) {
	live := w.live[:0]
	for _, it := range group {
		if it.res == nil || it.state.CompareAndSwap(queued, taken) {
			live = append(live, it)
		}
	}
	defer func() { clear(live); w.live = live[:0] }()
	for len(live) > 0 {
		w.running, w.failed, w.failErrFn = live, -1, nil
		var began time.Time
		if w.onCommit != nil {
			began = time.Now()
		}
		err := w.safeUpdate(w.runFn)
		failed, ferr := w.failed, w.failErrFn
		if w.onCommit != nil && failed < 0 {
			w.onCommit(len(live), time.Since(began), err)
		}
		w.running, w.failErrFn = nil, nil
		if failed >= 0 {
			w.finish(live[failed], ferr)
			live = append(live[:failed], live[failed+1:]...)
			continue
		}
		if err != nil {
			for _, it := range live {
				if it.res == nil {
					kept = append(kept, it)
				} else {
					it.res <- err
				}
			}
			if len(kept) > 0 && w.onAsync != nil {
				w.onAsync(fmt.Errorf("%d queued changes kept for the next commit: %w", len(kept), err))
			}
			return kept, err
		}
		for _, it := range live {
			w.finish(it, nil)
		}
		return nil, nil
	}
	return nil, nil
}

// runGroup runs the functions of w.running in tx, stopping at the first
// that fails (recorded in w.failed and w.failErrFn). It is the transaction
// function of every commit, kept as one method value so that a commit
// allocates no closure.
func (w *Writer[T]) runGroup(tx T) error {
	for i, it := range w.running {
		if err := w.call(it.fn, tx); err != nil {
			w.failed, w.failErrFn = i, err
			return errRerun
		}
	}
	return nil
}

func (w *Writer[T]) safeUpdate(fn func(T) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("groupcommit: commit panicked: %v", p)
		}
	}()
	return w.update(fn)
}

func (w *Writer[T]) call(fn func(T) error, tx T) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if w.recover != nil {
				err = w.recover(p)
			} else {
				err = fmt.Errorf("groupcommit: function panicked: %v", p)
			}
		}
	}()
	return fn(tx)
}

func (w *Writer[T]) finish(it *item[T], err error) {
	if it.res != nil {
		it.res <- err
		return
	}
	if err != nil && w.onAsync != nil {
		w.onAsync(err)
	}
	// Nobody else holds an item of Go once it is finished.
	it.fn = nil
	w.goItems.Put(it)
}
