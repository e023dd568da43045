// The commit: what its leader does, the hand-off of the lead, the timer.

package groupcommit

import (
	"fmt"
	"time"
)

// commitLocked commits one group: up to MaxGroup functions from the head
// of the queue. It reports whether the commit failed and kept functions
// of Go queued for a retry. The caller leads; w.mu is held, released
// during the commit and held again on return.
func (w *Writer[T]) commitLocked() (kept bool) {
	w.disarmLocked()
	w.due = false
	n := min(len(w.queue), w.maxGroup)
	closing := w.closed // after Close, every group is a last attempt
	group := w.group
	if n == len(w.queue) && cap(w.queue) <= w.maxGroup {
		// The common case: the group takes the whole queue. Swap the two
		// arrays instead of copying, so that a steady stream of groups
		// allocates no queue.
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

	left, err := w.run(group)
	clear(group)
	w.group = group[:0]

	w.mu.Lock()
	w.done += uint64(n - len(left))
	if len(left) > 0 {
		if closing {
			// Close makes one last attempt; after it, nothing is left to
			// retry with.
			w.lost = fmt.Errorf("%d changes: %w", len(left), err)
			w.done += uint64(len(left))
		} else {
			w.queue = append(left, w.queue...)
			w.failErr, w.fails, w.failN = err, w.fails+1, w.failN+1
			kept = true
		}
	} else if err == nil {
		w.fails = 0
	}
	if w.flushed != nil {
		close(w.flushed)
		w.flushed = nil
	}
	return kept
}

// leadOnceLocked takes the lead, commits one group and hands the lead on.
// Nobody leads; w.mu is held.
func (w *Writer[T]) leadOnceLocked() {
	w.leading = true
	w.commitLocked()
	w.handOffLocked()
}

// raiseLocked raises what a hook panicked with while the caller led, if
// anything, after unlocking w.mu. w.mu is held, and still held if nothing
// is raised.
func (w *Writer[T]) raiseLocked() {
	if p := w.panicked; p != nil {
		w.panicked = nil
		w.mu.Unlock()
		panic(p)
	}
}

// handOffLocked gives up the lead after a commit: to the first caller of
// Do still queued, woken with errLead, or to nobody, with the timer armed
// for the functions of Go left queued. After Close, the lead goes back to
// Close. w.mu is held.
func (w *Writer[T]) handOffLocked() {
	if w.closed {
		w.leading = false
		w.cond.Broadcast()
		return
	}
	for _, it := range w.queue {
		if it.res != nil && it.state.CompareAndSwap(queued, lead) {
			it.res <- errLead // buffered, and empty while queued
			return
		}
	}
	w.leading = false
	// A Sync waiting for what is left was woken by the commit and may
	// lead it; if not, the timer does.
	if len(w.queue) > 0 {
		w.armLocked()
	}
}

// armLocked arms the timer that leads a commit of the functions queued by
// Go when no Do comes to carry them: after the async delay, or after the
// retry delay when the last commit failed, or at once when the delay is
// over, or the queue is full or AsyncDelay negative and the last commit
// did not fail (what a failed commit kept may fill a group: it waits for
// the retry delay too). An armed timer that is not to fire at once is
// left as it is. w.mu is held, and nobody leads.
func (w *Writer[T]) armLocked() {
	now := w.due || (w.fails == 0 && (len(w.queue) >= w.maxGroup || w.asyncDelay < 0))
	if w.armed && !now {
		return
	}
	var delay time.Duration
	if !now {
		delay = max(w.asyncDelay, 0)
		if w.fails > 0 {
			// The last commit failed: wait before retrying what it kept,
			// doubling the wait with each failure.
			delay = min(max(delay, time.Millisecond)<<min(w.fails, 20), w.maxRetry)
		}
	}
	w.armed, w.deadline = true, time.Now().Add(delay)
	w.timer.Reset(delay)
}

// disarmLocked stops the timer. A firing already under way finds it
// disarmed, or armed again with a later deadline, and does nothing.
// w.mu is held.
func (w *Writer[T]) disarmLocked() {
	if w.armed {
		w.armed = false
		w.timer.Stop()
	}
}

// fire is the timer's function: it leads a commit of what is queued.
func (w *Writer[T]) fire() {
	w.mu.Lock()
	if !w.armed || time.Now().Before(w.deadline) || w.closed {
		// Stopped, or re-armed, since it fired; or Close commits.
		w.mu.Unlock()
		return
	}
	w.armed = false
	if w.leading || len(w.queue) == 0 {
		// A leader carries what is queued, or arms the timer again, at
		// once, when it hands off.
		w.due = w.leading
		w.mu.Unlock()
		return
	}
	w.leadOnceLocked()
	w.raiseLocked()
	w.mu.Unlock()
}

// run commits one group, rerunning it without any function that fails. If
// the commit fails, it returns the functions queued by Go, to be kept, and
// the error.
func (w *Writer[T]) run(group []*item[T]) (kept []*item[T], err error) {
	live := w.live[:0]
	for _, it := range group {
		if it.res == nil || it == w.self || it.state.CompareAndSwap(queued, taken) {
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
			w.callOnCommit(len(live), time.Since(began), err)
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
					w.deliver(it, err)
				}
			}
			if len(kept) > 0 && w.onAsync != nil {
				w.callOnAsync(fmt.Errorf("%d queued changes kept for the next commit: %w", len(kept), err))
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

// finish ends an item that ran, with its function's error or nil.
func (w *Writer[T]) finish(it *item[T], err error) {
	if it.res != nil {
		w.deliver(it, err)
		return
	}
	if err != nil && w.onAsync != nil {
		w.callOnAsync(err)
	}
	// Nobody else holds an item of Go once it is finished.
	it.fn = nil
	w.goItems.Put(it)
}

// deliver gives a caller of Do its result: the leader's own, or a waiter's
// through its channel.
func (w *Writer[T]) deliver(it *item[T], err error) {
	if it == w.self {
		w.self, w.selfErr = nil, err
		return
	}
	it.res <- err
}

// callOnCommit and callOnAsync call the hooks; a panic is kept for the
// leader to raise once the lead has passed on.
func (w *Writer[T]) callOnCommit(n int, d time.Duration, err error) {
	defer w.keepPanic()
	w.onCommit(n, d, err)
}

func (w *Writer[T]) callOnAsync(err error) {
	defer w.keepPanic()
	w.onAsync(err)
}

func (w *Writer[T]) keepPanic() {
	if p := recover(); p != nil && w.panicked == nil {
		w.panicked = p
	}
}
