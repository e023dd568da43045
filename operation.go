package idem

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/internal/fingerprint"
	"github.com/idemgo/idem/internal/wait"
)

// operation is one keyed operation's life in this process, from its
// reservation (or its claim by Resume) to the moment it ends: settled,
// when the caller received a response; left in doubt, when the caller got
// only an error after a request may have gone out; or failed unsent.
// RoundTrip and Resume both drive it; it calls only the journal below it.
//
// Its life, in the order of this file: newOperation makes it (a live
// call counts from then until end); begin (a call) or claimed (Resume)
// gives it its record and marks it in flight; Transport.attempts runs its
// attempts with it as their caller (body, tried, retrying); and it ends
// once, in end, by settle when the caller received the answer (deliver,
// answerBody), leaveInDoubt, stop when there is no response for the
// caller, or giveUp when Resume does not send it. reopen undoes an ending
// for a Resume handler that panicked.
type operation struct {
	j   *journal
	rec Operation // the journaled record; Header and Body are the request
	// resend is true when the record existed before this call: an earlier
	// request under its key may have been performed.
	resend bool
	// prior is the record's state and status before this call reopened it.
	prior     State
	priorCode int
	ids       flights
	live      bool
	wrote     atomic.Int32 // requests written, counted by httptrace
	replayMu  sync.Mutex
	replayAt  []time.Time // when net/http wrote the last attempt's request again
	reported  int         // AttemptDone events of this call
	written   int         // requests written by this call
	// unrecorded counts the requests written not yet recorded with
	// Attempt; -1 when the journal counted an attempt as started that
	// then wrote nothing (a refused connection): the next mark withdraws it.
	unrecorded int
	// started is 1 while the journal counts the attempt under way (or the
	// next one) as started: the first attempt of a new operation, counted
	// by its reservation, or one a mark before it counted (starting). Its
	// first request written is then already counted.
	started int
	marked  bool // the last attempt's outcome is recorded (recordAttempt)
	// keyed, for a provider whose key travels in the JSON body
	// (Provider.BodyKeyField), returns the caller's body with the key
	// written into it: what is journaled and sent.
	keyed func(key string) []byte
	// bodyChanged is set when an attempt's body, too large to journal,
	// streamed other bytes than its fingerprint's (verified).
	bodyChanged atomic.Bool
	mayHave     bool   // a request of this call may have reached the server
	status      int    // status of the last response, or 0
	reason      string // the classifier's reason for the last attempt
	once        sync.Once
	settledAs   State // the state settle recorded, or 0
	hooks       hookSet
	doubtful    bool                  // the answer delivered leaves it in doubt
	notKept     bool                  // the answer is a 409 saying it was performed, answer not kept
	original    int                   // then, the status the server first sent, or 0
	resource    string                // and the resource it made under the key, or ""
	match       [32]byte              // its key in recentCalls; zero: none
	trace       httptrace.ClientTrace // counts the requests written
	req         http.Request          // the request its attempts send (outgoing)
	answer      answerBody            // the body handed to the caller
	first       bytes.Reader          // the body of the first attempt
	keyValue    [1]string             // the key header's value
	flight      flightEntry           // its entry in the in-flight set, for a call

	// rewind returns the body of an attempt after the first; outgoing
	// sets it with the request it builds.
	rewind func() (io.ReadCloser, error)
}

// newOperation is where every operation begins: a caller's call (live),
// counted from now until it ends so that Close waits for it, or one that
// Resume claimed. A live call fails with ErrClosed once the Client is
// closing. The operation holds no record yet: begin (a call) or claimed
// (Resume) gives it one, and end, however it ends, uncounts it.
func (j *journal) newOperation(hooks hookSet, live bool) (*operation, error) {
	if live && !j.calls.begin() {
		return nil, fmt.Errorf("idem: client is closing: %w", ErrClosed)
	}
	return &operation{j: j, hooks: hooks, live: live}, nil
}

// hold gives the operation its record, marked in flight under ids, and
// keeps its lease renewed. prior is the record as it was before this call
// took it over (a re-drive, or Resume), or nil for one this call created.
func (o *operation) hold(rec Operation, ids flights, prior *Operation) {
	o.rec, o.ids = rec, ids
	if prior != nil {
		o.resend, o.prior, o.priorCode = true, prior.State, prior.LastStatus
	}
	o.j.armRenewal()
}

// journaled reports whether the operation holds a record.
func (o *operation) journaled() bool { return o.ids.n > 0 }

// begin reserves op in the journal for the operation, or takes over the
// record that has its key or name, and marks it in flight in this process.
// A call of the same key or name in flight here, or under another
// process's live lease, is waited for until ctx ends. mk is the call's
// match key (see recentCalls) and matched says that op.Key was taken from
// the recent call it names.
func (o *operation) begin(ctx context.Context, op Operation, mk [32]byte, matched bool) error {
	j := o.j
	if j.refused != nil {
		return &Error{Name: op.Name, Cause: ErrPolicyConflict, Err: j.refused}
	}
	o.match = mk
	poll := 10 * time.Millisecond
	for {
		ids := flightIDs(op.Key, op.Name)
		ids.e = &o.flight // released before each new try
		if wait, key := j.flight.acquire(&ids); wait != nil {
			if err := waitFor(ctx, wait); err != nil {
				return &Error{Key: key, Name: op.Name, Cause: ErrInProgress, Err: err}
			}
			continue
		}
		wait, err := o.reserve(ctx, &op, &ids, matched)
		if err == nil {
			return nil
		}
		j.flight.release(ids)
		var ie *Error
		switch {
		case wait != nil: // the name's key is busy here; err says which
			if werr := waitFor(ctx, wait); werr != nil {
				errors.As(err, &ie)
				ie.Err = werr
				return ie
			}
		case errors.Is(err, errMatchSettled):
			key, kerr := j.newKey()
			if kerr != nil {
				return &Error{Name: op.Name, Cause: ErrInvalidKey, Err: kerr}
			}
			op.Key, matched = key, false
		case errors.Is(err, ErrInProgress) && errors.As(err, &ie): // leased elsewhere
			if werr := sleep(ctx, poll); werr != nil {
				ie.Err = werr
				return ie
			}
			poll = min(2*poll, time.Second)
		default:
			return err
		}
	}
}

// errMatchSettled says that the recent call a call was matched to has
// ended with a definite answer its live caller received while this call
// waited for it, so this call is a new operation.
var errMatchSettled = errors.New("idem: the matched call's caller received a definite answer")

// reserve is one try of begin, with ids held. If the name's key is in
// flight here it returns the channel to wait on, with an *Error for the
// case that the wait ends first.
//
// A matched call (matched: op.Key came from recentCalls under mk) stays
// matched as long as the index holds that key for mk, whatever the
// record's state: only a live caller that received a definite answer ends
// a match (settle forgets it), while Resume finishing the operation for
// its own handler does not, so the caller's resend after a Resume gets the
// server's stored answer under the same key.
func (o *operation) reserve(ctx context.Context, op *Operation, ids *flights, matched bool) (<-chan struct{}, error) {
	j, mk := o.j, o.match
	j.stamp(op)
	if o.hooks.any() && op.Trace == "" {
		op.Trace = o.hooks.traceOf(ctx)
	}
	if err := checkReserve(op); err != nil {
		return nil, &Error{Name: op.Name, Cause: ErrInvalidKey, Err: err}
	}
	if o.keyed != nil { // the key travels in the body: journal it there
		op.Body = o.keyed(op.Key)
	}
	rec, created, err := j.store.Reserve(ctx, *op)
	if errors.Is(err, ErrOutcomeUnknown) { // op.Key may be journaled: in doubt
		return nil, &Error{Key: op.Key, Name: op.Name, State: StatePending, Cause: ErrOutcomeUnknown, Err: err}
	}
	if err != nil {
		return nil, &Error{Name: op.Name, Cause: journalCause(err), Err: unjournaled{err, op.Key}}
	}
	if created {
		j.flight.setKey(ids, rec.Key)
		rec.Header, rec.Body = op.Header, op.Body
		// The reservation counted the first attempt as started (op.Attempts
		// is 1): before this call, no request was written under the key.
		o.started, rec.Attempts = op.Attempts, 0
		o.hold(rec, *ids, nil)
		return nil, nil
	}
	if rec.Key != op.Key { // the name already had a key
		if wait := j.flight.rekey(ids, rec.Key); wait != nil {
			return wait, &Error{Key: rec.Key, Name: rec.Name, State: rec.State, Cause: ErrInProgress}
		}
	}
	fail := func(cause, err error) (<-chan struct{}, error) {
		return nil, &Error{Key: rec.Key, Name: rec.Name, State: rec.State, LastStatus: rec.LastStatus, Cause: cause, Err: err}
	}
	if matched {
		if k, ok := j.recent.match(mk); !ok || k != rec.Key {
			return nil, errMatchSettled
		}
		if rec.State == StateExpired {
			return fail(ErrExpired, nil)
		}
	}
	if rec.Fingerprint != op.Fingerprint {
		return fail(ErrKeyReused, nil)
	}
	if rec.State == StateExpired { // final: never sent again, by name or key
		return fail(ErrExpired, errExpiredFinal)
	}
	now := j.now()
	if why := j.tooOld(&rec, now); why != nil {
		return fail(ErrExpired, why)
	}
	if _, err := j.sendHeader(&rec); err != nil {
		return fail(ErrNotRetryable, err)
	}
	if o.keyed != nil && rec.Key != op.Key { // the body carries the record's key
		op.Body = o.keyed(rec.Key)
	}
	got, err := j.store.Acquire(ctx, rec.Key, j.newLease(now), Request{URL: op.URL, Header: op.Header, Body: op.Body})
	if errors.Is(err, ErrInProgress) {
		return fail(ErrInProgress, nil)
	}
	if errors.Is(err, ErrOutcomeUnknown) { // it may be pending under this lease now
		rec.State = StatePending
	}
	if err != nil {
		return fail(journalCause(err), err)
	}
	got.Header, got.Body = op.Header, op.Body
	o.hold(got, *ids, &rec)
	return nil, nil
}

// claimed returns the operation for a record Resume claimed, or nil if it
// is not Resume's to send: in flight in this process (its caller owns the
// outcome), or no longer pending. The claim was read with its page, and a
// live call may have settled the operation since.
func (j *journal) claimed(ctx context.Context, rec Operation, hooks hookSet) *operation {
	ids := flightIDs(rec.Key, rec.Name)
	if wait, _ := j.flight.acquire(&ids); wait != nil {
		return nil
	}
	o, _ := j.newOperation(hooks, false) // only a live call can fail
	o.hold(rec, ids, &rec)
	if cur, err := j.store.Get(ctx, rec.Key); err != nil || cur.State != StatePending {
		o.end(nil)
		return nil
	}
	return o
}

// names returns the operation's key and name.
func (o *operation) names() (key, name string) { return o.rec.Key, o.rec.Name }

// body returns the request body for attempt n: the journaled body, read
// by a reader the operation holds for the first attempt, or a fresh one
// from o.rewind.
func (o *operation) body(n int) (io.ReadCloser, error) {
	if n == 1 && len(o.rec.Body) > 0 {
		o.first.Reset(o.rec.Body)
		return io.NopCloser(&o.first), nil
	}
	return o.rewind()
}

// tried counts the requests an attempt wrote, as httptrace reported
// them, and calls the AttemptDone hook once per request written
// (attemptsDone), net/http's silent replays included.
func (o *operation) tried(ctx context.Context, tr try) try {
	tr.count(int(o.wrote.Swap(0)))
	o.written += tr.writes
	w := tr.writes
	if o.started > 0 { // counted when it started; -1 if it wrote nothing
		o.started, w = 0, w-1
	}
	o.unrecorded += w
	o.marked = false
	o.mayHave = o.mayHave || tr.sent && tr.writes > 0
	o.reason = tr.reason
	if o.hooks.any() {
		o.attemptsDone(ctx, tr.writes, tr.began, tr.resp, tr.err, tr.reason)
	}
	return tr
}

// retrying records the failed attempt tr before the wait for the next
// one, and calls the RetryScheduled hook.
func (o *operation) retrying(ctx context.Context, tr try, wait time.Duration, source string) {
	errText := ""
	if tr.resp == nil {
		errText = tr.err.Error()
	}
	o.recordAttempt(statusOf(tr.resp), errText, tr.reason, true)
	if o.hooks.any() {
		o.hooks.retryScheduled(RetryInfo{OperationInfo: o.info(StatePending), Context: ctx, Attempt: o.reported,
			Delay: wait, Reason: tr.reason, Source: source})
	}
}

// recordAttempt records the attempts not yet recorded, with the last
// outcome and why it did not end the operation; the operation stays
// pending. With next (a retry is due) the mark also counts the next
// attempt as started, so that no mark of its own is needed before it
// goes (starting makes the mark durable then); a retry whose wait the
// context cuts short still counts.
func (o *operation) recordAttempt(status int, errText, reason string, next bool) {
	a, ok := o.unrecordedAttempt(status, errText, reason, next)
	if !ok {
		return
	}
	if err := o.j.store.Attempt(context.Background(), o.rec.Key, a); err != nil {
		o.j.journalFailed(context.Background(), o.hooks, o.info(StatePending), WriteAttempt, err)
	}
}

// starting runs just before attempt n is sent and makes sure the journal
// counts it as started, durably, so that a crash while it is on the wire
// cannot hide it (Attempts, and the Earlier and resend count of the next
// resend, count every request the server may have seen). The first
// attempt of a new operation was counted by its reservation, at no cost;
// a retry by the mark before its wait (recordAttempt). The first attempt
// of a resend (Resume, a re-drive) gets a mark of its own, "resend",
// which keeps the record's last status and error. A mark is queued by
// the store (Attempt returns before its commit); the lease renewal that
// follows is a write the store makes durable before it returns, and with
// it every change queued before (the bbolt journal commits in order; a
// store that does not, such as pgstore's asynchronous marks, keeps the
// mark as durable as its other attempt marks).
func (o *operation) starting(n int) {
	if n == 1 && o.started > 0 {
		return // counted by the reservation, which was durable before
	}
	ctx := context.Background()
	if o.started == 0 { // a resend's first attempt
		a := Attempt{Sent: 1, Status: o.rec.LastStatus, Err: o.rec.LastError, Reason: "resend", At: o.j.now(), Owner: o.j.owner}
		o.started = 1
		if err := o.j.store.Attempt(ctx, o.rec.Key, a); err != nil {
			o.j.journalFailed(ctx, o.hooks, o.info(StatePending), WriteAttempt, err)
			return
		}
	}
	now := o.j.now()
	if err := o.j.store.Renew(ctx, o.rec.Key, o.j.newLease(now)); err != nil {
		o.j.journalFailed(ctx, o.hooks, o.info(StatePending), WriteLease, err)
	}
}

// unrecordedAttempt returns the Attempt that records the attempts not yet
// recorded, with the last outcome, and counts them as recorded; it
// reports false when there is nothing to record. With next it also counts
// the next attempt as started (recordAttempt). An attempt counted as
// started that wrote nothing (o.unrecorded -1) is withdrawn by the next
// one's start; with no next one (in doubt) it stays counted, since
// History's counts are never negative.
func (o *operation) unrecordedAttempt(status int, errText, reason string, next bool) (Attempt, bool) {
	o.status = status
	if o.marked && o.unrecorded == 0 && !next {
		return Attempt{}, false
	}
	a := Attempt{Sent: max(o.unrecorded, 0), Status: status, Err: recordedText(errText), Reason: recordedReason(reason), At: o.j.now(), Owner: o.j.owner}
	if next {
		a.Sent = o.unrecorded + 1
		o.started = 1
	}
	o.unrecorded, o.marked = 0, true
	return a, true
}

// end runs once when the operation ends, however it ends. fn (nil: none)
// writes the ending to the journal, then calls the hooks; if a hook
// panics, the operation still leaves flight (and its call is uncounted)
// before the panic goes on.
func (o *operation) end(fn func()) {
	o.once.Do(func() {
		defer o.leave()
		if fn != nil {
			fn()
		}
	})
}

// leave takes the ended operation out of flight, and uncounts its call.
func (o *operation) leave() {
	o.j.flight.release(o.ids)
	if o.live {
		o.j.calls.done()
	}
}

// settle records that the caller received resp's answer: a success, or a
// final failure (permanent, or transient with no attempts left), or a 409
// saying the server performed the request and kept no answer (performed),
// which records what the server says happened (see notKeptOutcome).
func (o *operation) settle(v verdict, status int) {
	o.end(func() {
		state := StateFailed
		if v == success {
			state = StateSucceeded
		}
		out := Outcome{State: state, Status: status, Sent: o.unrecorded, At: o.j.now()}
		if v == performed {
			out.State, out.Status, out.Err = notKeptOutcome(o.original, o.resource)
			state = out.State
		}
		o.settledAs = state
		if err := o.j.finish(context.Background(), &o.rec, out); err != nil {
			// The journal still holds the operation as pending: no Settled.
			o.j.journalFailed(context.Background(), o.hooks, o.info(StatePending), WriteFinish, err)
		} else if o.hooks.any() {
			o.hooks.settled(o.info(state))
		}
		if v == transient {
			o.j.recent.add(o.match, o.rec.Key)
		} else {
			o.j.recent.forget(o.match, o.rec.Key)
		}
	})
	o.j.maybeSweep()
}

// inDoubtGrace is how long past its caller's deadline (or the end of its
// context) an operation left in doubt may take to write its marks: the
// attempt, and the release of its lease.
const inDoubtGrace = time.Second

// leaveInDoubt ends the operation without an answer for the caller after a
// request may have reached the server: it stays pending for Resume or a
// re-drive, and its lease is released so either may start at once. If the
// operation had ended already it changes nothing and reports whether it
// was settled.
//
// The caller waits for its marks (the attempt, the lease's release) until
// its context has ended plus inDoubtGrace; the marks are not cancelled
// with it. When the journal has not written them by then, leaveInDoubt
// returns and they go on in the background, for at most the lease (past
// it the lease has lapsed anyway), and a failure is logged; the operation
// stays in flight in this process until they end, and pending in the
// journal whatever they do (a mark never finishes an operation). A caller
// without a deadline waits for them as long as its context lives.
func (o *operation) leaveInDoubt(status int, cause error) (settled bool) {
	o.once.Do(func() {
		handedOff := false
		defer func() {
			if !handedOff {
				o.leave()
			}
		}()
		text := ""
		if cause != nil {
			text = cause.Error()
		}
		reason := o.reason
		if status >= 200 && status < 300 && cause != nil { // the answer's body was lost
			_, reason, _ = classifyError(cause)
		}
		a, hasAttempt := o.unrecordedAttempt(status, text, reason, false)
		now := o.j.now()
		// The marks themselves run until the lease would have lapsed
		// anyway; the caller waits for them until its grace ends.
		wctx, wcancel := context.WithTimeout(context.WithoutCancel(o.req.Context()), o.j.lease)
		ctx, cancel := wait.Grace(o.req.Context(), inDoubtGrace)
		defer cancel()
		var attemptErr, leaseErr error
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer wcancel()
			if hasAttempt {
				attemptErr = o.j.store.Attempt(wctx, o.rec.Key, a)
			}
			leaseErr = o.j.store.Renew(wctx, o.rec.Key, Lease{Owner: o.j.owner, At: now, Until: now})
			if errors.Is(leaseErr, ErrLeaseLost) {
				leaseErr = nil
			}
		}()
		if werr := wait.For(ctx, "the marks of an operation left in doubt", done); werr != nil {
			handedOff = true
			key, log := o.rec.Key, o.j.log
			go func() {
				<-done
				o.leave()
				if attemptErr != nil {
					log.Error("idem: journal write failed", "idem.key", key, "idem.journal.write", WriteAttempt, "exception.message", attemptErr)
				}
				if leaseErr != nil {
					log.Error("idem: journal write failed", "idem.key", key, "idem.journal.write", WriteLease, "exception.message", leaseErr)
				}
			}()
			o.j.log.Warn("idem: operation left in doubt; its journal marks go on in the background", "idem.key", o.rec.Key, "exception.message", werr)
		} else {
			if attemptErr != nil {
				o.j.journalFailed(context.Background(), o.hooks, o.info(StatePending), WriteAttempt, attemptErr)
			}
			if leaseErr != nil {
				o.j.journalFailed(context.Background(), o.hooks, o.info(StatePending), WriteLease, leaseErr)
			}
		}
		o.j.recent.add(o.match, o.rec.Key)
		o.j.log.Warn("idem: operation left in doubt", "idem.key", o.rec.Key, "idem.operation", o.rec.Name, "exception.message", secrets.redactText(text))
		if o.hooks.any() {
			o.hooks.inDoubt(o.info(StatePending), cause)
		}
	})
	return o.settledAs != 0
}

// stop ends a call that has no response for the caller and returns its
// error. If a request under the key may have reached the server, now or
// before, the operation is left in doubt; otherwise it ends as failed,
// unsent (or, reopened for this call, goes back to how it was).
func (o *operation) stop(cause, err error) error {
	e := &Error{Key: o.rec.Key, Name: o.rec.Name, Attempts: o.written, LastStatus: o.status, Cause: cause, Err: err, State: StatePending}
	why := cause
	if err != nil {
		why = err
	}
	if o.mayHave || o.resend && o.prior == StatePending {
		o.leaveInDoubt(o.status, why)
		return e
	}
	e.State = StateFailed
	// Sent withdraws the start the journal counted for an attempt that
	// wrote nothing (o.unrecorded is 0 or -1 here).
	out := Outcome{State: StateFailed, Err: "not sent: " + why.Error(), Sent: o.unrecorded, At: o.j.now()}
	if o.resend {
		e.State = o.prior
		out.State, out.Status, out.Err = o.prior, o.priorCode, o.rec.LastError
	}
	o.end(func() {
		if err := o.j.finish(context.Background(), &o.rec, out); err != nil {
			o.j.journalFailed(context.Background(), o.hooks, o.info(out.State), WriteFinish, err)
		}
	})
	return e
}

// giveUp ends a claimed operation that Resume does not send and returns
// the error that says why. An operation given up as StateExpired or
// StateFailed is finished in the journal so; one given up as StatePending
// stays as it was, for a fixed hook, a re-drive or the next Resume.
func (o *operation) giveUp(state State, cause, err error) *Error {
	rec := &o.rec
	o.end(func() {
		if state.Finished() {
			text := cause.Error()
			if err != nil {
				text = err.Error()
			}
			if ferr := o.j.finish(context.Background(), rec, Outcome{State: state, Status: rec.LastStatus, Err: text, At: o.j.now()}); ferr != nil {
				err = errors.Join(err, ferr)
			}
		}
	})
	if state == StateExpired && o.hooks.any() {
		o.hooks.expired(o.info(state))
	}
	return &Error{Key: rec.Key, Name: rec.Name, State: state, LastStatus: rec.LastStatus, Cause: cause, Err: err}
}

// reopen makes the operation pending again after Resume's handler
// panicked with its outcome, so that the next Resume delivers it once
// more (the server replays it): it is left in doubt, or, if it had
// settled already (the handler read the answer before it panicked), its
// record is acquired again.
func (o *operation) reopen(status int, why error) error {
	if !o.leaveInDoubt(status, why) {
		return nil
	}
	_, err := o.j.store.Acquire(context.Background(), o.rec.Key, o.j.newLease(o.j.now()), Request{URL: o.rec.URL, Header: o.rec.Header, Body: o.rec.Body})
	return err
}

// settledMeanwhile reports whether the journal holds a definite answer
// for the operation now: Resume ended it without one (it stays pending for
// a reason Resume reports), and a live call settled it before the report
// reached the handler.
func (o *operation) settledMeanwhile() bool {
	cur, err := o.j.store.Get(context.Background(), o.rec.Key)
	return err == nil && (cur.State == StateSucceeded || cur.State == StateFailed)
}

// deliver hands resp to the caller as the operation's answer. The
// operation settles when the caller has read the body to its end or closed
// it; a read error leaves it in doubt instead, since the caller never
// learned the answer. A 401, 403 or 407 to a resend says nothing about the
// earlier request and leaves the operation in doubt too; so does a 409 "in
// progress" when attempts ran out: a request under the key is still being
// handled, so its outcome is unknown, and the operation stays pending for
// Resume or a re-drive, never failed.
func (o *operation) deliver(resp *http.Response, v verdict) *http.Response {
	o.status = resp.StatusCode
	if v == performed {
		p, _ := PerformedOf(resp) // a provider's dialect marked it with the resource
		p.Status = notKeptStatus(resp)
		o.notKept, o.original, o.resource = true, p.Status, p.Resource
		setPerformed(resp, p)
	} else {
		delete(resp.Header, PerformedHeader) // the server's, not idem's
	}
	o.doubtful = o.resend && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden ||
		resp.StatusCode == http.StatusProxyAuthRequired) ||
		v == transient && resp.StatusCode == http.StatusConflict || v == inProgress
	if resp.Body == nil || resp.Body == http.NoBody {
		o.received(v)
		return resp
	}
	o.answer = answerBody{rc: resp.Body, o: o, v: v}
	resp.Body = &o.answer
	return resp
}

// answered returns the state the answer resp, delivered, leaves the
// operation in once its caller has read it: pending when it leaves it in
// doubt (a 401, 403 or 407 to a resend, a 409 "in progress"), else
// succeeded or failed.
func (o *operation) answered(resp *http.Response) State {
	switch {
	case o.doubtful:
		return StatePending
	case resp.StatusCode < 400:
		return StateSucceeded
	}
	return StateFailed
}

// notKeptOutcome returns what the journal records for an operation the
// server performed without keeping (or replaying) its answer: idemserver's
// ProblemNotKept, given the status the server first sent (0: unknown), or
// a provider's performed code (GoCardless's idempotent_creation_conflict),
// given the resource the server made under the key ("": not named). It is
// finished, never sent again: succeeded with the original status if that
// was a 2xx or 3xx (what classifyResponse calls success), succeeded with
// 409 when the server names the resource it made (it was created), else
// failed with the original status (409 when unknown); and an error text
// that says the request was performed, so that no one reads "failed" as
// "not charged" and re-drives it under a new name.
func notKeptOutcome(original int, resource string) (State, int, string) {
	const text = "performed by server, answer not kept"
	state, status := StateFailed, original
	switch {
	case original >= 200 && original < 400:
		state = StateSucceeded
	case original == 0:
		status = http.StatusConflict
		if resource != "" {
			state = StateSucceeded
		}
	}
	var why []string
	if original != 0 {
		why = append(why, "original status "+strconv.Itoa(original))
	}
	if resource != "" {
		why = append(why, "conflicting resource "+resource)
	}
	if len(why) == 0 {
		return state, status, text + " (status unknown)"
	}
	return state, status, text + " (" + strings.Join(why, ", ") + ")"
}

// received ends the operation once its answer reached the caller: in
// doubt if deliver found the answer leaves it so, else settled.
func (o *operation) received(v verdict) {
	if o.doubtful {
		o.leaveInDoubt(o.status, fmt.Errorf("status %d to a resend", o.status))
		return
	}
	o.settle(v, o.status)
}

// answerBody is the body of an operation's answer: reading it to the end,
// or closing it, settles the operation; a read error leaves it in doubt.
// It passes reads through as they come, so streams stay streams.
type answerBody struct {
	rc io.ReadCloser
	o  *operation
	v  verdict
}

func (b *answerBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		b.o.received(b.v)
	case err != nil:
		b.o.leaveInDoubt(b.o.status, fmt.Errorf("reading the response body: %w", err))
	}
	return n, err
}

func (b *answerBody) Close() error {
	err := b.rc.Close()
	b.o.received(b.v)
	return err
}

// verified returns getBody made to check every body it returns against
// fp, the fingerprint taken of the first: each attempt's body is hashed
// as it streams, and one whose bytes differ fails its last read (its last
// bytes are held back until the end is seen, so a server that reads the
// whole body never gets the other payload whole) and marks the operation,
// which then stops before any other attempt (changed).
func (o *operation) verified(getBody func() (io.ReadCloser, error), method, url string, h http.Header, fp [32]byte) func() (io.ReadCloser, error) {
	// The payload headers, as they are now: the caller may change its
	// request once RoundTrip returns.
	ph := make(http.Header, len(fingerprint.PayloadHeaders))
	for _, k := range fingerprint.PayloadHeaders {
		if v := h.Values(k); len(v) > 0 {
			ph[k] = slices.Clone(v)
		}
	}
	return func() (io.ReadCloser, error) {
		rc, err := getBody()
		if err != nil {
			return nil, err
		}
		return &verifiedBody{rc: rc, br: bufio.NewReader(rc), s: fingerprint.NewStream(method, url, ph), want: fp, o: o}, nil
	}
}

// changed reports a body that streamed other bytes than its fingerprint's.
func (o *operation) changed() error {
	if !o.bodyChanged.Load() {
		return nil
	}
	return errBodyChanged
}

// errBodyChanged is the error the last read of a changed body returns.
var errBodyChanged = fmt.Errorf("%w (it must return the same bytes every time)", ErrBodyChanged)

// verifiedBody is one attempt's body of a request too large to journal,
// checked against the fingerprint as it streams.
type verifiedBody struct {
	rc   io.ReadCloser
	br   *bufio.Reader
	s    *fingerprint.Stream
	want [32]byte
	o    *operation
	done bool
}

func (v *verifiedBody) Read(p []byte) (int, error) {
	if v.done {
		return 0, io.EOF
	}
	n, err := v.br.Read(p)
	v.s.Write(p[:n])
	if err == nil && n > 0 {
		if _, perr := v.br.Peek(1); perr == io.EOF {
			err = io.EOF // p[:n] are the last bytes: check before handing them on
		} else if perr != nil {
			return n, nil // the next read reports it
		}
	}
	if err != io.EOF {
		return n, err
	}
	v.done = true
	if v.s.Sum() != v.want {
		v.o.bodyChanged.Store(true)
		return 0, errBodyChanged
	}
	if n > 0 {
		return n, nil
	}
	return 0, io.EOF
}

func (v *verifiedBody) Close() error { return v.rc.Close() }

// info returns the operation's OperationInfo in state.
func (o *operation) info(state State) OperationInfo {
	r := &o.rec
	return OperationInfo{Key: r.Key, Name: r.Name, Method: r.Method, URL: r.URL, State: state, Attempts: o.written, Resend: o.resend, Earlier: r.Attempts, Trace: r.Trace}
}

// attemptsDone calls AttemptDone once per request the last attempt wrote
// (n; 0 when nothing was written, which still reports the attempt once).
// Every request but the last was lost with its connection and written
// again by net/http; each is reported as lasting until the next write.
func (o *operation) attemptsDone(ctx context.Context, n int, began time.Time, resp *http.Response, err error, reason string) {
	o.replayMu.Lock()
	replays := o.replayAt
	o.replayAt = o.replayAt[:0]
	o.replayMu.Unlock()
	start := began
	for i := 0; i < n-1; i++ {
		at := start
		if i < len(replays) {
			at = replays[i]
		}
		o.reported++
		o.hooks.attemptDone(AttemptInfo{OperationInfo: o.info(StatePending), Context: ctx, Attempt: o.reported,
			Err: ErrTransportResent, Reason: "connection closed", Latency: at.Sub(start)})
		start = at
	}
	o.reported++
	a := AttemptInfo{OperationInfo: o.info(StatePending), Context: ctx, Attempt: o.reported,
		Err: err, Reason: reason, Latency: time.Since(start)}
	if resp != nil {
		a.Status = resp.StatusCode
		a.Protocol = protocolVersion(resp)
	}
	o.hooks.attemptDone(a)
}

// protocolVersion returns resp's HTTP version as OpenTelemetry writes it:
// "1.0", "1.1", "2", "3" (a minor version only when it is not 0, or for
// HTTP/1), or "" when the response has none.
func protocolVersion(resp *http.Response) string {
	switch {
	case resp.ProtoMajor == 1 && resp.ProtoMinor == 1:
		return "1.1"
	case resp.ProtoMajor == 1 && resp.ProtoMinor == 0:
		return "1.0"
	case resp.ProtoMajor >= 2 && resp.ProtoMinor == 0:
		return strconv.Itoa(resp.ProtoMajor)
	case resp.ProtoMajor == 0:
		return ""
	}
	return strconv.Itoa(resp.ProtoMajor) + "." + strconv.Itoa(resp.ProtoMinor)
}

// resends returns the http.request.resend_count of the next request of a
// call: every request under the key so far, this call's and earlier ones
// (an unkeyed call counts its tries instead).
func (o *operation) resends(int) int {
	return o.rec.Attempts + o.written
}

// traced returns ctx with the operation's httptrace.ClientTrace, which
// counts the requests written; httptrace.WithClientTrace composes it with
// a trace ctx has of its own.
//
// It costs the context httptrace.WithClientTrace allocates. The operation
// used to hold that context itself, answering httptrace's key, which it
// found by probing httptrace.ContextClientTrace with a context that noted
// the key asked for: one allocation saved per keyed request, against a
// dependence on how an unexported key of the standard library is looked
// up (a change there would have left idem's count of requests written,
// and so net/http's silent replays, to the fallback of one per attempt).
func (o *operation) traced(ctx context.Context) context.Context {
	o.trace.WroteHeaders = o.countWrite
	return httptrace.WithClientTrace(ctx, &o.trace)
}

// countWrite counts one request written, and notes the time of every one
// after an attempt's first: net/http's silent replays.
func (o *operation) countWrite() {
	if o.wrote.Add(1) > 1 {
		o.replayMu.Lock()
		o.replayAt = append(o.replayAt, time.Now())
		o.replayMu.Unlock()
	}
}
