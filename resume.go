package idem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// Resume finishes the operations pending in the journal: those whose
// outcome no caller learned because the process died, or because the last
// attempt ended without a response. It claims them (in a shared journal,
// only those this Client owns or whose lease lapsed), re-sends each
// journaled request with its original key through the retry policy, and
// calls fn once per operation with the final response (the body is
// readable; fn must close it) or the error. Sends run in parallel (see
// WithResumeConcurrency); fn is called from one goroutine at a time, in the
// order the operations finish.
//
// An operation is not sent, and fn gets an *Error saying why, when it is
// older than the resend window or dated in the future (ErrExpired: it is
// marked expired, for the application to reconcile with the server); when
// its credentials were not journaled and no WithResumePrepare hook is set
// (ErrNoCredentials: it stays pending); when its body was not journaled
// (ErrNotRetryable: it stays pending, a re-drive with its name or key
// still works); or when its record cannot be read (ErrJournalCorrupt or
// ErrRecordVersion, with only Key set). An operation in flight in this
// process (a live call) is skipped: its caller owns its outcome.
//
// If fn panics, the operation is made pending again, so that the next
// Resume delivers its outcome once more (the server replays it), and Resume
// goes on with the others. Resume returns an error that joins the panics,
// the count of records it could not read, and a journal read error; it
// returns early with ctx's cause when ctx ends, also while it waits for
// another Resume.
func (c *Client) Resume(ctx context.Context, fn func(op Operation, resp *http.Response, err error)) error {
	return c.resume(ctx, 0, fn)
}

// resumePage is how many pending operations Resume claims at a time.
const resumePage = 256

// resumed is one operation's outcome on its way to fn.
type resumed struct {
	op   Operation
	resp *http.Response
	err  error
	o    *operation // nil when nothing was sent; set with every resp
}

// resume is Resume for operations last updated at least minAge ago.
func (c *Client) resume(ctx context.Context, minAge time.Duration, fn func(Operation, *http.Response, error)) error {
	if err := c.t.j.refused; err != nil {
		return fmt.Errorf("idem: resume: %w", err)
	}
	select {
	case c.resuming <- struct{}{}:
	case <-c.closing.Done():
		return fmt.Errorf("idem: resume: %w", ErrClosed)
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	c.resumeMu.Lock()
	if c.closing.Err() != nil { // the token was free, and Shutdown had begun
		c.resumeMu.Unlock()
		<-c.resuming
		return fmt.Errorf("idem: resume: %w", ErrClosed)
	}
	done := make(chan struct{})
	c.resumeDone = done
	c.resumeMu.Unlock()
	defer func() {
		close(done)
		<-c.resuming
	}()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(c.closing, func() { cancel(ErrClosed) })()
	if fn == nil {
		fn = c.logOutcome
	}
	var (
		j          = c.t.j
		jobs       = make(chan Operation)
		results    = make(chan resumed)
		workers    sync.WaitGroup
		readErr    error
		unreadable []error
		cutoff     = j.now().Add(-minAge)
	)
	for range c.t.cfg.resumeWorkers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for op := range jobs {
				if r, ok := c.resumeOne(ctx, op); ok {
					results <- r
				}
			}
		}()
	}
	go func() {
		defer func() {
			close(jobs)
			workers.Wait()
			close(results)
		}()
		for after := ""; ; {
			page, err := j.claimPending(ctx, after, resumePage)
			if err != nil && len(page) == 0 {
				readErr = fmt.Errorf("idem: resume: reading pending operations: %w", err)
				return
			}
			if len(page) == 0 {
				return
			}
			after = page[len(page)-1].Key
			for _, op := range page {
				if op.State == 0 { // a record the store could not read
					e := unreadableError(op, err)
					unreadable = append(unreadable, e)
					select {
					case results <- resumed{op: op, err: e}:
					case <-ctx.Done():
						return
					}
					continue
				}
				if op.Updated.After(cutoff) {
					j.releaseClaim(ctx, op) // too recent: leave it to others at once
					continue
				}
				select {
				case jobs <- op:
				case <-ctx.Done():
					return
				}
			}
		}
	}()

	var errs []error
	for r := range results {
		if err := c.deliver(r, fn); err != nil {
			errs = append(errs, err)
		}
	}
	if len(unreadable) > 0 {
		errs = append(errs, fmt.Errorf("idem: resume: %d pending operations could not be read: %w", len(unreadable), errors.Join(unreadable...)))
	}
	if readErr != nil {
		errs = append(errs, readErr)
	}
	if ctx.Err() != nil {
		errs = append(errs, context.Cause(ctx))
	}
	return errors.Join(errs...)
}

// unreadableError is the error Resume reports for a pending record the
// store could not read: storeErr is what the store said of its page.
func unreadableError(op Operation, storeErr error) error {
	cause := ErrJournalCorrupt
	if errors.Is(storeErr, ErrRecordVersion) && !errors.Is(storeErr, ErrJournalCorrupt) {
		cause = ErrRecordVersion
	}
	if op.LastError != "" {
		storeErr = errors.New(op.LastError)
	}
	return &Error{Key: op.Key, Cause: cause, Err: storeErr}
}

// resumeOne sends one claimed operation, unless it is in flight here, and
// returns its outcome.
func (c *Client) resumeOne(ctx context.Context, rec Operation) (resumed, bool) {
	j := c.t.j
	o := j.claimed(ctx, rec, hooksFor(ctx, c.t.cfg.hooks))
	if o == nil {
		return resumed{}, false // in flight here or settled; its caller has the outcome
	}
	notSent := func(state State, cause, err error) (resumed, bool) {
		e := o.giveUp(state, cause, err)
		j.logResumed(&rec, false, 0, cause)
		rec.State = state
		return resumed{op: rec, err: e}, true
	}
	if why := j.tooOld(&rec, j.now()); why != nil {
		if why == ErrExpired {
			why = nil
		}
		return notSent(StateExpired, ErrExpired, why)
	}
	if rec.Unreplayable {
		return notSent(StatePending, ErrNotRetryable, errors.New("idem: the body was over the journal's limit and was not journaled; re-drive it with its name or key"))
	}
	prepare := c.t.cfg.prepare
	if rec.Redacted && prepare == nil {
		return notSent(StatePending, ErrNoCredentials, nil)
	}
	req, err := http.NewRequestWithContext(ctx, rec.Method, rec.URL, nil)
	if err == nil {
		err = checkRequest(req)
	}
	if err != nil {
		return notSent(StateFailed, ErrInvalidRequest, err)
	}
	keyHeader, err := j.sendHeader(&rec) // the header the operation was sent with
	if err != nil {
		return notSent(StatePending, ErrNotRetryable, err)
	}
	if rec.Host != "" {
		req.Host = rec.Host
	}
	req = c.t.outgoing(o, req, rec.Header, keyHeader, nil)
	if prepare != nil {
		if err := prepare(req); err != nil {
			return notSent(StatePending, fmt.Errorf("idem: resume prepare hook: %w", err), nil)
		}
		// What the hook added must be sendable too; the operation stays
		// pending for a fixed hook.
		if err := checkRequest(req); err != nil {
			return notSent(StatePending, ErrInvalidRequest, fmt.Errorf("idem: after the resume prepare hook: %w", err))
		}
	}
	resp, err := c.t.attempts(ctx, o, req)
	if o.hooks.any() {
		o.hooks.resumed(o.info(StatePending), statusOf(resp), err)
	}
	j.logResumed(&rec, true, statusOf(resp), err)
	return resumed{op: rec, resp: resp, err: err, o: o}, true
}

// deliver calls fn with an operation's outcome. If fn panics it closes the
// response, makes the operation pending again, and returns the panic as an
// error.
func (c *Client) deliver(r resumed, fn func(Operation, *http.Response, error)) (perr error) {
	rec := r.op
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		perr = fmt.Errorf("idem: resume handler panicked for operation %s: %v", quote(rec.Key), p)
		if r.o == nil {
			return
		}
		if err := r.o.reopen(statusOf(r.resp), perr); err != nil {
			perr = errors.Join(perr, err)
		}
		if r.resp != nil {
			r.resp.Body.Close()
		}
	}()
	var ie *Error
	if r.resp == nil && r.o != nil && errors.As(r.err, &ie) && ie.State == StatePending && r.o.settledMeanwhile() {
		return nil // a live call settled it after Resume let it go: its caller has the answer
	}
	if r.resp != nil {
		rec.LastStatus = r.resp.StatusCode
		rec.State = r.o.answered(r.resp)
		if r.o.notKept { // the record the journal keeps (see notKeptOutcome)
			rec.State, rec.LastStatus, rec.LastError = notKeptOutcome(r.o.original, r.o.resource)
		}
	} else if errors.As(r.err, &ie) {
		rec.State = ie.State
	}
	fn(rec, r.resp, r.err)
	return nil
}

// logOutcome is the handler of a background Resume without one: it logs
// the outcome and closes the body.
func (c *Client) logOutcome(op Operation, resp *http.Response, err error) {
	log := c.t.cfg.logger
	if resp != nil {
		resp.Body.Close()
		log.Info("idem: resumed operation", "idem.key", op.Key, "idem.operation", op.Name, "http.response.status_code", resp.StatusCode)
		return
	}
	log.Warn("idem: resumed operation failed", "idem.key", op.Key, "idem.operation", op.Name, "exception.message", errText(err))
}

// resumeLoop is the background resumer: every interval it resumes the
// operations that have been pending for at least that long.
func (c *Client) resumeLoop() {
	defer close(c.resumerDone)
	ctx := c.closing
	every := c.t.cfg.resumeEvery
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if err := c.resume(ctx, every, c.t.cfg.resumeFn); err != nil && ctx.Err() == nil {
				c.t.cfg.logger.Warn("idem: background resume", "exception.message", errText(err))
			}
		}
	}
}
