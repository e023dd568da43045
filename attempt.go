package idem

import (
	"context"
	"io"
	"net/http"
	"time"
)

// One attempt of a call, as Transport.send runs it: the caller it reports
// to (the journaled operation of a keyed request, or an unkeyed call) and
// what the attempt got and how it counts.

// caller is what the attempts of one call report to: the journaled
// operation of a keyed request, or an unkeyed call. Each attempt asks it
// for a body, tells it what the attempt got, and then either hands it the
// answer, stops it, or tells it a retry is due.
type caller interface {
	// body returns the body for attempt n (from 1), or nil to send the
	// request's own.
	body(n int) (io.ReadCloser, error)
	// starting runs just before attempt n (from 1) is sent.
	starting(n int)
	// tried records what an attempt got and returns it counted: with its
	// writes set, and a transient verdict made permanent when the request
	// must not go again. (A try goes by value, so that it stays on the
	// stack.)
	tried(ctx context.Context, tr try) try
	// retrying records a failed attempt before the wait for the next one.
	retrying(ctx context.Context, tr try, wait time.Duration, source string)
	// deliver hands resp to the caller as the call's answer.
	deliver(resp *http.Response, v verdict) *http.Response
	// stop ends a call that has no response for the caller and returns
	// its error.
	stop(cause, err error) error
	// changed returns why the call must stop before another attempt, an
	// error matching ErrBodyChanged, or nil.
	changed() error
	// names returns the key and name the log shows for the call.
	names() (key, name string)
	// resends returns the http.request.resend_count of the next request
	// of a call that has made tries attempts.
	resends(tries int) int
}

var (
	_ caller = (*operation)(nil)
	_ caller = (*unkeyed)(nil)
)

// try is one attempt of a call: what it got and how it counts.
type try struct {
	began  time.Time // when it was sent
	resp   *http.Response
	err    error
	v      verdict
	reason string
	sent   bool // a request may have reached the server
	writes int  // requests it wrote; counted by caller.tried
}

// classify sets the attempt's verdict from its error, or from its
// response by byResponse (the configuration's classify).
func (tr *try) classify(ctx context.Context, byResponse func(*http.Response) (verdict, string)) {
	tr.sent = true
	if tr.err != nil {
		tr.v, tr.reason, tr.sent = classifyError(tr.err)
		if ctx.Err() != nil {
			tr.v, tr.reason = permanent, "context done"
		}
	} else {
		tr.v, tr.reason = byResponse(tr.resp)
	}
}

// count sets the requests the attempt wrote: n, as httptrace reported
// them, or one for a base RoundTripper that does not report writes.
func (tr *try) count(n int) {
	if n == 0 && (tr.resp != nil || tr.sent) {
		n = 1 // a base RoundTripper that does not report writes
	}
	tr.writes = n
	tr.sent = tr.sent || n > 0
}

func statusOf(resp *http.Response) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}
