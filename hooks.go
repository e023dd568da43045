package idem

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Hooks are callbacks for what idem does, in the style of
// net/http/httptrace.ClientTrace: every field is optional and a nil one
// costs nothing. Set them for a Client with WithHooks, or for the requests
// of one context with WithRequestHooks. Like httptrace's ClientTrace, hooks
// compose: every WithHooks adds to the Client's hooks, every
// WithRequestHooks adds to those already in the context, and an event
// calls them all, the Client's first, each in the order it was added.
// Hooks are called synchronously on the goroutine doing the work (the
// caller's, Resume's, or, for JournalCommit, whichever goroutine led the
// commit: a caller's, possibly another request's, or the journal's timer):
// keep them quick, and do not call back into the Client from them.
//
// A hook that panics does not leave its operation in flight: the
// operation's ending (settled, in doubt, or failed unsent when no request
// went out) is written to the journal and the operation is released
// before the panic goes on up the caller's goroutine, so a re-drive of its
// name or key, Resume and Close do not wait for it.
type Hooks struct {
	// AttemptDone is called after each attempt with what it got.
	AttemptDone func(AttemptInfo)
	// RetryScheduled is called before the wait for the next attempt.
	RetryScheduled func(RetryInfo)
	// Settled is called when the caller received an operation's answer
	// (its body read to the end or closed) and the journal accepted its
	// finish mark: Resume will not send it again. (A re-drive by the same
	// name or key sends it again, and gets the server's stored answer.)
	// If the finish mark failed, JournalError is called instead.
	Settled func(op OperationInfo)
	// InDoubt is called when an operation ends without a definite answer
	// for the caller after a request may have reached the server: the
	// caller got only an error, or the answer's body could not be read, or
	// the answer says nothing of the outcome (a 401, 403 or 407 to a
	// resend, a 409 "in progress" when attempts ran out). It stays pending
	// for Resume or a re-drive.
	InDoubt func(op OperationInfo, err error)
	// Resumed is called by Resume for each operation it finished, with the
	// status it got (0 for none) or the error.
	Resumed func(op OperationInfo, status int, err error)
	// Expired is called when Resume gives up an operation unsent because
	// it is past the resend window. (A call or re-drive refused for the
	// same reason gets an error matching ErrExpired and calls no hook.)
	Expired func(op OperationInfo)
	// JournalCommit is called after each commit of the bbolt journal that
	// Open opened (for a store given to New, use its own options, such as
	// BoltOptions.OnCommit): how many changes it carried, how long it took
	// with its fsyncs, and its error. Only the Client's hooks get it.
	JournalCommit func(JournalCommitInfo)
	// JournalError is called when a journal write for an operation failed:
	// its reservation (then nothing was sent and the caller gets the
	// error), the record of an attempt, its finish mark (then Settled is
	// not called: the journal still holds the operation as pending, and
	// Resume may send it again), or its lease. idem also logs each at
	// Error. The marks of an operation left in doubt that are still
	// being written when its caller's context has ended plus a second go
	// on in the background, and a failure of theirs is only logged.
	JournalError func(JournalErrorInfo)
	// TraceContext is called when an operation is journaled (reserved),
	// with the request's context, and returns the W3C traceparent of the
	// context's span (or ""). The journal keeps it with the operation
	// (Operation.Trace), and hands it to the hooks of every later attempt
	// (OperationInfo.Trace), so that a resend, by Resume in another
	// process included, can link its spans to the original trace. Unlike
	// the other hooks it is not called for each set of hooks: the first
	// well-formed traceparent returned wins, and a malformed one is
	// dropped. The OpenTelemetry adapter (package idemotel) sets it.
	TraceContext func(ctx context.Context) string
}

// JournalErrorInfo describes a journal write that failed.
type JournalErrorInfo struct {
	// OperationInfo is the operation the write was for. A reservation that
	// failed has no key yet unless the operation was journaled before.
	OperationInfo
	// Context is the request's context, or Background for writes made
	// after the call returned.
	Context context.Context
	// Write names the write: WriteReserve, WriteAttempt, WriteFinish or
	// WriteLease.
	Write string
	// Err is the store's error.
	Err error
}

// JournalCommitInfo describes one commit of the journal.
type JournalCommitInfo struct {
	// Changes counts the changes the commit carried (its group size).
	Changes int
	// Latency is how long the commit took, fsyncs included.
	Latency time.Duration
	// Err is the commit's error, or nil.
	Err error
}

// OperationInfo names an operation in a hook.
type OperationInfo struct {
	Key, Name, Method, URL string
	// State is the operation's state after the event.
	State State
	// Attempts counts the requests written under the key by this call.
	Attempts int
	// Resend reports that requests under the key may have been sent before
	// this call: a re-drive, or Resume.
	Resend bool
	// Earlier counts the requests written under the key before this call,
	// as the journal counted them (0 for a new operation).
	Earlier int
	// Trace is the W3C traceparent journaled with the operation when it
	// was first reserved (Hooks.TraceContext), or "": on a resend, the
	// trace of the call that first sent it.
	Trace string
}

// AttemptInfo describes one attempt.
type AttemptInfo struct {
	OperationInfo
	// Context is the request's context, for example to parent a span.
	Context context.Context
	// Attempt is the request's number within the call, from 1. Every
	// request written counts, including one net/http wrote again on its
	// own after a reused connection closed (then Err is set and Reason is
	// "connection closed" for the lost one), so AttemptDone is called once
	// per request on the wire; an attempt that wrote nothing (the
	// connection failed) is reported once too.
	Attempt int
	// Status is the response's status, or 0 when none came.
	Status int
	// Err is the error when no response came.
	Err error
	// Reason is how idem classified the outcome, for example "503",
	// "connection failed", "409 in progress".
	Reason string
	// Latency is how long the attempt took until its response headers or
	// its error.
	Latency time.Duration
	// Protocol is the HTTP version of the response, such as "1.1" or "2"
	// (as OpenTelemetry's network.protocol.version), or "" when none came
	// or the base RoundTripper did not set it.
	Protocol string
}

// RetryInfo describes a scheduled retry.
type RetryInfo struct {
	OperationInfo
	// Context is the request's context.
	Context context.Context
	// Attempt is the number of the attempt that failed.
	Attempt int
	// Delay is how long idem waits before the next attempt.
	Delay time.Duration
	// Reason is why the attempt is retried.
	Reason string
	// Source is what set the delay: "backoff", "Retry-After" or
	// "Retry-After-Ms".
	Source string
}

type hooksContext struct{}

// WithRequestHooks returns a context whose requests call h's hooks, besides
// the Client's and those of any WithRequestHooks already in ctx. As with
// httptrace.WithClientTrace, hooks compose: a second registration adds to
// the first, never replaces it. The Client's hooks are called first, then
// the context's in the order they were added.
func WithRequestHooks(ctx context.Context, h *Hooks) context.Context {
	if h == nil {
		return ctx
	}
	old, _ := ctx.Value(hooksContext{}).(hookList)
	return context.WithValue(ctx, hooksContext{}, append(old[:len(old):len(old)], h))
}

// hookList is hooks in the order they were added.
type hookList []*Hooks

// hookSet is the hooks of one call: the Client's and the context's.
type hookSet struct{ client, req hookList }

func hooksFor(ctx context.Context, client hookList) hookSet {
	h, _ := ctx.Value(hooksContext{}).(hookList)
	return hookSet{client, h}
}

// each calls fn with every hook of the set, the Client's first.
func (hs hookSet) each(fn func(*Hooks)) {
	for _, h := range hs.client {
		fn(h)
	}
	for _, h := range hs.req {
		fn(h)
	}
}

// any reports whether a hook is set at all, so callers can skip building
// event values.
func (hs hookSet) any() bool { return len(hs.client) > 0 || len(hs.req) > 0 }

func (hs hookSet) attemptDone(a AttemptInfo) {
	hs.each(func(h *Hooks) {
		if h.AttemptDone != nil {
			h.AttemptDone(a)
		}
	})
}

func (hs hookSet) retryScheduled(r RetryInfo) {
	hs.each(func(h *Hooks) {
		if h.RetryScheduled != nil {
			h.RetryScheduled(r)
		}
	})
}

func (hs hookSet) settled(op OperationInfo) {
	hs.each(func(h *Hooks) {
		if h.Settled != nil {
			h.Settled(op)
		}
	})
}

func (hs hookSet) inDoubt(op OperationInfo, err error) {
	hs.each(func(h *Hooks) {
		if h.InDoubt != nil {
			h.InDoubt(op, err)
		}
	})
}

func (hs hookSet) resumed(op OperationInfo, status int, err error) {
	hs.each(func(h *Hooks) {
		if h.Resumed != nil {
			h.Resumed(op, status, err)
		}
	})
}

func (hs hookSet) expired(op OperationInfo) {
	hs.each(func(h *Hooks) {
		if h.Expired != nil {
			h.Expired(op)
		}
	})
}

func (hs hookSet) journalError(e JournalErrorInfo) {
	hs.each(func(h *Hooks) {
		if h.JournalError != nil {
			h.JournalError(e)
		}
	})
}

// commitHook returns a BoltOptions.OnCommit that calls the JournalCommit
// hooks of l, or nil if none is set.
func (l hookList) commitHook() func(int, time.Duration, error) {
	var fns []func(JournalCommitInfo)
	for _, h := range l {
		if h.JournalCommit != nil {
			fns = append(fns, h.JournalCommit)
		}
	}
	if len(fns) == 0 {
		return nil
	}
	return func(n int, d time.Duration, err error) {
		info := JournalCommitInfo{Changes: n, Latency: d, Err: err}
		for _, fn := range fns {
			fn(info)
		}
	}
}

// Journal writes named in JournalErrorInfo.Write.
const (
	// WriteReserve is the write before the first request: the
	// reservation of a new operation, or the reopening of a journaled one.
	// When it fails nothing is sent.
	WriteReserve = "reserve"
	// WriteAttempt records the requests of an attempt that will be retried.
	WriteAttempt = "attempt"
	// WriteFinish is the finish mark of an operation that ended.
	WriteFinish = "finish"
	// WriteLease releases or renews an operation's lease.
	WriteLease = "lease"
)

// ErrTransportResent is AttemptInfo.Err for a request that net/http wrote
// again on its own, within one attempt: the reused connection closed before
// any response came, and a request with an Idempotency-Key header is one
// net/http replays. The request written after it has the attempt's outcome.
var ErrTransportResent = errors.New("idem: the connection closed before a response came; net/http wrote the request again")

// Log attributes follow one style: OpenTelemetry's names where they have
// one (http.response.status_code, http.request.resend_count,
// exception.message for an error's text), idem.* otherwise, and durations
// as milliseconds with the unit in the name (durationMS), since a JSON
// handler prints a time.Duration as bare nanoseconds.

// durationMS returns d as the attribute key, in milliseconds.
func durationMS(key string, d time.Duration) slog.Attr {
	return slog.Float64(key, float64(d)/float64(time.Millisecond))
}

// traceOf returns the trace context the hooks give for ctx: the first
// well-formed traceparent a TraceContext hook returns, or "". It is
// called only when a hook is set.
func (hs hookSet) traceOf(ctx context.Context) string {
	tp := ""
	hs.each(func(h *Hooks) {
		if tp == "" && h.TraceContext != nil {
			if s := h.TraceContext(ctx); ValidTraceparent(s) {
				tp = s
			}
		}
	})
	return tp
}
