// Package wait is the one way idem waits for something it does not
// control (a goroutine, a store call, the application's code) under a
// caller's bound: every shutdown and close wait, the in-doubt path and the
// body peek go through For, so that each returns when its context ends and
// says what it gave up waiting for.
package wait

import (
	"context"
	"sync"
	"time"
)

// Error is what For returns when ctx ended first: What names the thing
// still awaited, Err is the context's cause.
type Error struct {
	What string
	Err  error
}

// Error says what For gave up waiting for, and why.
func (e *Error) Error() string { return "still waiting for " + e.What + ": " + e.Err.Error() }

// Unwrap returns the context's cause, so that errors.Is(err,
// context.DeadlineExceeded) holds for a deadline.
func (e *Error) Unwrap() error { return e.Err }

// For waits until done is closed or ctx ends. It returns nil if done is
// closed, also when ctx has ended too (it looks at done first, so that it
// never reports as pending what has happened), else an *Error naming
// what.
func For(ctx context.Context, what string, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	default:
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return &Error{What: what, Err: context.Cause(ctx)}
	}
}

// Group returns a channel closed when wg's counter is zero. It waits on
// wg in a goroutine of its own, which ends with wg's last Done.
func Group(wg *sync.WaitGroup) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		wg.Wait()
		close(ch)
	}()
	return ch
}

// Do runs fn in a goroutine of its own and waits for it as For does: it
// returns fn's error, or an *Error naming what if ctx ends first. fn then
// goes on in the background with ctx (which has ended); its error is
// dropped.
func Do(ctx context.Context, what string, fn func(context.Context) error) error {
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		err = fn(ctx)
	}()
	if werr := For(ctx, what, done); werr != nil {
		return werr
	}
	return err
}

// Grace returns a context that parent's cancellation does not end, but
// that ends grace after parent does: at parent's deadline plus grace, or
// grace after parent is cancelled, whichever comes first. Of a parent
// without a deadline that is never cancelled, it ends only with the
// returned cancel. The work a caller must not abandon at its deadline
// (the marks of an operation left in doubt) runs under it.
func Grace(parent context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	base, cancelDeadline := context.WithoutCancel(parent), context.CancelFunc(func() {})
	if dl, ok := parent.Deadline(); ok {
		base, cancelDeadline = context.WithDeadline(base, dl.Add(grace))
	}
	ctx, cancel := context.WithCancelCause(base)
	var (
		mu    sync.Mutex
		t     *time.Timer
		ended bool
	)
	stop := context.AfterFunc(parent, func() {
		mu.Lock()
		defer mu.Unlock()
		if !ended {
			t = time.AfterFunc(grace, func() { cancel(context.Cause(parent)) })
		}
	})
	return ctx, func() {
		stop()
		mu.Lock()
		ended = true
		if t != nil {
			t.Stop()
		}
		mu.Unlock()
		cancel(context.Canceled)
		cancelDeadline()
	}
}
