// Package groupcommit commits the writes of many goroutines together: one
// transaction, and so one fsync, per group.
//
// A Writer has no goroutine of its own. A caller of Do that finds no
// commit running leads one: it runs the transaction on its own goroutine,
// carrying everything queued (up to a cap), its own function included. A
// caller that arrives while a commit runs queues its function and waits;
// when that commit ends, its leader wakes the callers it carried and hands
// the lead to the first caller still queued, whose commit takes everything
// queued meanwhile. So a lone caller commits at once, as a bare
// transaction would, with no goroutine switch, and a crowd shares fsyncs.
// Nobody who waits for durability waits for a group to fill, and no leader
// runs a group after its own: its caller returns as soon as its own
// function is durable. Functions queued with Go, whose callers do not
// wait, ride the next commit that someone waits for; if none comes within
// Options.AsyncDelay, a timer leads a commit for them.
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
//
// One commit runs at a time, so the hooks (Options.OnCommit,
// OnAsyncError) are never called concurrently, but they are called on the
// goroutine of the commit's leader: a caller of Do, Sync or Close, or the
// timer's. A hook that panics does not stop the Writer: the commit's
// callers get their results, the lead passes on, and then the panic goes
// on up the leader's goroutine.
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
	// OnAsyncError is called, on the goroutine of the commit's leader, with
	// the error of a function queued by Go (which is then dropped: it
	// failed, not the disk), or once per failed commit that carried
	// functions queued by Go (which are kept for the next commit). Nil
	// ignores such errors. It must not block.
	OnAsyncError func(error)
	// OnCommit, if set, is called on the goroutine of the commit's leader
	// after every commit, before the commit's callers are woken, with the
	// number of functions it carried, how long it took and its error. It
	// must not block.
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
	goItems sync.Pool // of *item[T] without, for Go; the leader returns them

	// Used by the leader only, for the group it runs. The lead passes
	// under mu, which orders one leader's use before the next one's.
	group     []*item[T]
	live      []*item[T]
	running   []*item[T]
	failed    int
	failErrFn error
	runFn     func(T) error // w.runGroup
	self      *item[T]      // the leading caller's own item until it has its result
	selfErr   error         // that result
	panicked  any           // what a hook panicked with, re-raised by the leader

	timer *time.Timer // calls w.fire; armed and stopped under mu

	mu        sync.Mutex
	cond      *sync.Cond // signalled when the lead is free after Close
	queue     []*item[T]
	leading   bool          // a commit runs, or its leader is about to run one
	closed    bool          // Close was called
	due       bool          // the async delay of the queued Go functions is over
	armed     bool          // the timer runs out the async or retry delay
	deadline  time.Time     // when the armed timer is due; an earlier firing is stale
	enq       uint64        // functions ever queued
	done      uint64        // functions ever finished, in queue order
	flushed   chan struct{} // closed after the next commit; nil until a Sync waits
	closeDone chan struct{} // closed when the first Close has committed what was left
	failErr   error         // error of the last failed commit that kept functions queued
	fails     int           // commits failed in a row
	failN     uint64        // commits ever failed that kept functions queued, for Sync
	lost      error         // the error that made Close drop queued functions
}

type item[T any] struct {
	fn    func(T) error
	state atomic.Int32
	res   chan error // nil for Go
}

const (
	queued int32 = iota
	lead         // chosen to lead: its caller leads, or is being woken with errLead
	taken
	cancelled
)

var (
	// errRerun marks the rollback of a group because one function failed.
	errRerun = errors.New("groupcommit: rerun group")
	// errLead, sent to a waiting caller of Do, hands it the lead.
	errLead = errors.New("groupcommit: lead the next commit")
)

// New returns a Writer whose commits call update, which must run its
// argument in one read-write transaction, commit it durably and return the
// argument's error or the commit's error (bbolt's DB.Update does this).
// Close commits what is left.
func New[T any](update func(func(T) error) error, o Options) *Writer[T] {
	w := &Writer[T]{
		update:     update,
		maxGroup:   o.MaxGroup,
		onAsync:    o.OnAsyncError,
		onCommit:   o.OnCommit,
		asyncDelay: o.AsyncDelay,
		recover:    o.Recover,
		maxRetry:   o.MaxRetryDelay,
		closeDone:  make(chan struct{}),
	}
	if w.maxGroup <= 0 {
		w.maxGroup = 1024
	}
	if w.asyncDelay == 0 {
		w.asyncDelay = 20 * time.Millisecond
	}
	if w.maxRetry <= 0 {
		w.maxRetry = time.Second
	}
	w.runFn = w.runGroup
	w.cond = sync.NewCond(&w.mu)
	w.timer = time.AfterFunc(time.Hour, w.fire)
	w.timer.Stop()
	return w
}

// Do queues fn and waits until the group that ran it has committed. It
// returns fn's error, or the commit's error, or nil once fn's effects are
// durable. If no commit is running, fn's group is committed on the
// calling goroutine. If ctx ends while fn is still queued, fn is dropped
// and Do returns the context's cause; once fn's group has started, or its
// caller was chosen to lead it, Do waits for it. A Do that leads and
// finds a commit ahead of its function fail and keep functions of Go
// returns that commit's error without running fn.
func (w *Writer[T]) Do(ctx context.Context, fn func(T) error) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	// Items of Do, with their channel, are reused once their result is in.
	it, _ := w.items.Get().(*item[T])
	if it == nil {
		it = &item[T]{res: make(chan error, 1)}
	}
	it.fn = fn
	it.state.Store(queued)
	if err := w.enqueue(it, &w.items); err != nil {
		return err
	}
	if !w.leading {
		w.leading = true
		it.state.Store(lead)
		return w.leadFor(it)
	}
	w.mu.Unlock()
	var err error
	select {
	case err = <-it.res:
	case <-ctx.Done():
		if it.state.CompareAndSwap(queued, cancelled) {
			// The queue still holds it: not reusable. And fn never runs
			// now (run skips a cancelled item): boltjournal reuses a
			// Reserve's change, fn's receiver, as soon as Do returns
			// (boltjournal/boltwrite.go, reservation), so running a
			// change after its Do returned would write another
			// reservation's record. docs/DESIGN.md, "Allocation
			// invariants"; TestCancelWhileQueued pins it.
			return context.Cause(ctx)
		}
		err = <-it.res
	}
	if err == errLead {
		w.mu.Lock()
		return w.leadFor(it)
	}
	it.fn = nil
	w.items.Put(it)
	return err
}

// enqueue locks w.mu, queues it (which came from pool) and returns nil
// with w.mu held. After Close it unlocks w.mu, puts it back in pool and
// returns ErrClosed.
func (w *Writer[T]) enqueue(it *item[T], pool *sync.Pool) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		it.fn = nil
		pool.Put(it)
		return ErrClosed
	}
	w.queue = append(w.queue, it)
	w.enq++
	return nil
}

// leadFor commits groups, as the leader, until the one carrying it (the
// caller's own item) has committed, or one ahead of it failed and kept
// functions of Go (then it returns that failure and it is dropped), hands
// the lead on and returns its result. w.mu is held, and unlocked on
// return.
func (w *Writer[T]) leadFor(it *item[T]) error {
	w.self = it
	dropped := false
	for w.self != nil {
		if kept := w.commitLocked(); kept && w.self != nil {
			// A group ahead of it failed to commit and kept functions of
			// Go, which head every group until a commit succeeds: rather
			// than retry them at once, for as long as the disk refuses,
			// fail closed, as its group would have. It stays queued,
			// cancelled, as an item whose context ended, so its fn never
			// runs after Do returns (see Do's cancel path).
			it.state.Store(cancelled)
			w.self, w.selfErr, dropped = nil, w.failErr, true
		}
	}
	err := w.selfErr
	w.selfErr = nil
	w.handOffLocked()
	if !dropped {
		it.fn = nil
		w.items.Put(it)
	}
	w.raiseLocked()
	w.mu.Unlock()
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
	if err := w.enqueue(it, &w.goItems); err != nil {
		return err
	}
	if !w.leading {
		// A running commit's leader arms the timer when it hands off.
		w.armLocked()
	}
	w.mu.Unlock()
	return nil
}

// Sync waits until every function queued before it was called has run and
// its group has committed. It returns at once if nothing is queued or
// running, and returns the context's cause if ctx ends first. If no commit
// is running, Sync leads the commits it waits for on its own goroutine;
// after a failed commit it waits for the retry instead, and returns its
// error if what it waits for is kept again.
func (w *Writer[T]) Sync(ctx context.Context) error {
	w.mu.Lock()
	if w.closed && w.enq == w.done {
		w.mu.Unlock()
		return ErrClosed
	}
	target, failN := w.enq, w.failN
	for w.done < target {
		if w.failN != failN {
			// What Sync waits for is kept for a later commit.
			err := w.failErr
			w.mu.Unlock()
			return err
		}
		if !w.leading && w.fails == 0 {
			// After a failed commit, a waiting Sync does not hurry the
			// retry: it returns the failure instead.
			w.leadOnceLocked()
			w.raiseLocked()
			continue
		}
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
	}
	w.mu.Unlock()
	return nil
}

// Close waits for the running commit, then runs and commits everything
// queued on the calling goroutine, making one last attempt at what failed
// commits kept. It returns an error wrapping that attempt's failure if
// queued changes could not be written. Later calls of Do, Go, Sync and
// Close return ErrClosed (a later Close once the first has returned).
func (w *Writer[T]) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.closeDone
		return ErrClosed
	}
	w.closed = true
	w.disarmLocked()
	for w.leading {
		w.cond.Wait()
	}
	w.leading = true // for good
	for len(w.queue) > 0 {
		w.commitLocked()
	}
	close(w.closeDone)
	w.raiseLocked()
	w.mu.Unlock()
	if w.lost != nil {
		return fmt.Errorf("groupcommit: queued changes not written: %w", w.lost)
	}
	return nil
}
