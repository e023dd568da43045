package idem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/idemgo/idem/internal/fingerprint"
)

// Transport is an http.RoundTripper that makes non-idempotent requests safe
// to retry. Get one from Client.Transport or use Client.HTTPClient.
//
// For a keyed request (POST and PATCH by default) it:
//
//  1. refuses a request that can never be sent (no URL, a scheme other
//     than http or https, no host, a header net/http would refuse to
//     write, a body whose length is not its ContentLength);
//  2. chooses the key: WithKey, then WithOperation, then a key already on
//     the request's header, then the key of a recent call in this process
//     that was the same call (method, URL, body, non-volatile headers,
//     principal) and ended without a definite answer its caller received
//     (an SDK's own retry), then a new random UUIDv7;
//  3. reads the body (at most the body limit) and fingerprints the payload;
//  4. journals key, fingerprint and the replayable request (credentials
//     removed) and waits until the journal has made them durable: if the
//     journal fails, nothing is sent. A call of the same key or name in
//     flight, here or under another process's lease, is waited for first;
//  5. sends, classifies the outcome, and retries transient failures with the
//     same key and a byte-identical body, waiting with exponential backoff
//     and full jitter or the server's Retry-After;
//  6. hands the response to the caller: the operation is settled once the
//     caller has read the body to its end or closed it. A read error
//     leaves it in doubt.
//
// It returns the final response as it is, including a 5xx or 429 when
// attempts ran out, and returns an error (an *Error) only when it has no
// response for the caller. An operation whose outcome is unknown (the last
// attempt failed without a response, the context ended after a request
// went out, or the response body could not be read) stays pending in the
// journal; Client.Resume finishes it, and a re-drive with the same key or
// name sends it again.
//
// What survives a crash: every operation whose reservation returned is in
// the journal with its key and request, so a restarted process resumes it
// with its original key. Attempt counts and finish marks are written
// without waiting for their own commit; a crash in the few milliseconds
// before that commit lets Resume deliver an operation whose caller already
// had its answer once more (the server replays it; reconcile by key).
//
// Every request written counts as an attempt, including net/http's own
// silent replay of a request on a keep-alive connection that died before
// any answer (it treats requests carrying Idempotency-Key as replayable).
//
// Requests with other methods carry no key. GET, HEAD, PUT, DELETE, OPTIONS
// and TRACE are idempotent (RFC 9110 §9.2.2) and are retried when their body
// can be rewound (no body, or GetBody set). Other requests without a key are
// retried only when the failure proves nothing reached the server.
//
// Transport is safe for concurrent use. As the RoundTripper contract asks,
// it closes the request body, also on errors, and does not modify the
// request. Close every response body, as net/http asks: an answer whose
// body is never read to its end nor closed keeps its operation in flight,
// so later calls of the same key or name wait for it until their context
// ends, and Client.Close waits for it up to its bound. The zero Transport
// has no journal and refuses every request.
type Transport struct {
	cfg config
	j   *journal
}

var _ http.RoundTripper = (*Transport)(nil)

// errNoJournal is returned by a zero Transport.
var errNoJournal = fmt.Errorf("%w: a zero idem.Transport has no journal; use Client.Transport", ErrClosed)

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.j == nil {
		closeBody(req)
		return nil, errNoJournal
	}
	if err := checkRequest(req); err != nil {
		closeBody(req)
		return nil, err
	}
	keyed := t.cfg.keyed[req.Method] && !withoutKey(req.Context())
	if keyed && !validHeaderName(t.cfg.header) {
		closeBody(req)
		return nil, fmt.Errorf("%w: key header name %s is not an HTTP token", ErrInvalidRequest, quote(t.cfg.header))
	}
	if !t.j.calls.begin() {
		closeBody(req)
		return nil, fmt.Errorf("idem: client is closing: %w", ErrClosed)
	}
	if !keyed {
		defer t.j.calls.done()
		return t.roundTripUnkeyed(req)
	}
	// Until reserve returns an operation, this call is counted here; then
	// the operation's end uncounts it. A panic on the way uncounts it too.
	owned := false
	defer func() {
		if !owned {
			t.j.calls.done()
		}
	}()
	o, out, err := t.reserve(req)
	if err != nil {
		return nil, err
	}
	owned = true
	return t.attempts(req.Context(), o, out, out.GetBody)
}

// reserve journals a keyed request and returns its operation and the
// request to send: a copy of req with its own header, the key set, and a
// body that each attempt rewinds.
func (t *Transport) reserve(req *http.Request) (*operation, *http.Request, error) {
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		closeBody(req)
		return nil, nil, err
	}
	key, name, src, err := t.chooseKey(req)
	if err != nil {
		closeBody(req)
		return nil, nil, &Error{Name: name, Cause: ErrInvalidKey, Err: err}
	}
	body, rest, err := readBody(req, t.cfg.maxBody)
	if err != nil {
		return nil, nil, &Error{Name: name, Cause: invalidIf(err), Err: fmt.Errorf("idem: reading request body: %w", err)}
	}

	jurl, redacted := t.cfg.journaledURL(req.URL)
	header, secrets := t.cfg.journaledHeader(req.Header)
	var fp [32]byte
	if rest != nil {
		if fp, err = t.largeFingerprint(req, jurl, rest); err != nil {
			cause := invalidIf(err)
			if cause == nil {
				cause = ErrBodyTooLarge
			}
			return nil, nil, &Error{Name: name, Cause: cause, Err: err}
		}
		body = nil
	} else {
		fp = fingerprint.Sum(req.Method, jurl, req.Header, body)
	}
	matched := false
	mk := t.cfg.matchKey(fp, req)
	if src == keyNew {
		if k, ok := t.j.recent.match(mk); ok {
			key, matched = k, true
		}
	}
	now := time.Now()
	op := Operation{
		Key: key, Name: name, Method: req.Method, URL: jurl, Fingerprint: fp,
		State: StatePending, Created: now, Owner: t.j.owner, LeaseUntil: now.Add(t.j.lease),
		Redacted: redacted || secrets, Unreplayable: rest != nil,
		Header: header, Body: body,
	}
	if req.Host != "" && req.Host != req.URL.Host {
		op.Host = req.Host
	}
	o, err := t.j.begin(ctx, op, mk, matched)
	if err != nil {
		if journalFault(err) {
			t.j.reserveFailed(ctx, hooksFor(ctx, t.cfg.hooks), &op, err)
		}
		if ie := (*Error)(nil); errors.As(err, &ie) && ie.Cause == ErrOutcomeUnknown {
			t.j.recent.add(mk, ie.Key) // its resend must find the key that may be journaled
		}
		return nil, nil, err
	}
	o.hooks = hooksFor(ctx, t.cfg.hooks)
	o.match = mk

	out := req.WithContext(o.traced(ctx))
	o.keyValue[0] = o.rec.Key
	out.Header = outgoingHeader(req.Header, t.cfg.header, o.keyValue[:])
	out.Body = nil
	if rest != nil {
		out.GetBody = someBody(req.GetBody)
	} else {
		out.ContentLength = int64(len(body))
		out.GetBody = bodyFunc(body)
	}
	return o, out, nil
}

// largeFingerprint returns the fingerprint of a keyed request whose body
// is over the journal's limit, if the Client sends such bodies and the
// request can produce its body again: the fingerprint is taken over one
// pass of GetBody, and every attempt sends another.
func (t *Transport) largeFingerprint(req *http.Request, url string, rest io.ReadCloser) ([32]byte, error) {
	rest.Close()
	if !t.cfg.sendLarge {
		return [32]byte{}, fmt.Errorf("body is larger than %d bytes", t.cfg.maxBody)
	}
	if req.GetBody == nil {
		return [32]byte{}, fmt.Errorf("body is larger than %d bytes and the request has no GetBody to send it again", t.cfg.maxBody)
	}
	b, err := someBody(req.GetBody)()
	if err != nil {
		return [32]byte{}, fmt.Errorf("GetBody: %w", err)
	}
	defer b.Close()
	cr := &countingReader{r: b}
	fp, err := fingerprint.SumReader(req.Method, url, req.Header, cr)
	if err == nil && req.ContentLength > 0 && cr.n != req.ContentLength {
		err = lengthError(cr.n, req.ContentLength)
	}
	return fp, err
}

// attempts runs the attempts of one call: send, classify, wait, send
// again. o is the journaled operation, or nil for a request without a key.
// For a keyed request every attempt takes a fresh body from rewind; a
// request without a key is sent as it is first, and rewound for a retry
// (rewind nil: it cannot be sent twice).
//
// If something panics on the way (a hook, the base RoundTripper), the
// operation ends before the panic goes on: left in doubt if a request may
// have reached the server, else failed unsent.
func (t *Transport) attempts(ctx context.Context, o *operation, req *http.Request, rewind func() (io.ReadCloser, error)) (resp *http.Response, err error) {
	if o == nil {
		return t.send(ctx, o, req, rewind)
	}
	returned := false
	defer func() {
		if !returned {
			o.stop(ErrNotRetryable, errPanicked)
		}
	}()
	resp, err = t.send(ctx, o, req, rewind)
	returned = true
	return resp, err
}

// errPanicked is why an operation ended when a panic went through it.
var errPanicked = errors.New("idem: a panic went through the call (a hook or the base RoundTripper)")

// send is attempts without the panic guard.
func (t *Transport) send(ctx context.Context, o *operation, req *http.Request, rewind func() (io.ReadCloser, error)) (*http.Response, error) {
	p := t.cfg.policy
	bo := lazyBackOff{p: p}
	start := time.Now()
	host := req.URL.Host
	unsafe := o == nil && !idempotent[req.Method]
	tries := 0
	t.cfg.budget.deposit(host)
	for attempt := 1; ; attempt++ {
		// A keyed request is our own copy: its first attempt sends it;
		// every later attempt sends a copy with a fresh body.
		r := req
		if attempt > 1 {
			r = new(http.Request)
			*r = *req
		}
		if o != nil || attempt > 1 {
			b, err := o.body(attempt, rewind)
			if err != nil {
				return nil, o.stop(ErrNotRetryable, fmt.Errorf("idem: rewinding the request body: %w", err))
			}
			r.Body = b
		}
		began := time.Now()
		resp, err := t.cfg.base.RoundTrip(r)

		var (
			v      verdict
			reason string
			sent   = true
		)
		if err != nil {
			v, reason, sent = classifyError(err)
			if ctx.Err() != nil {
				v, reason = permanent, "context done"
			}
		} else {
			v, reason = t.cfg.classify(resp)
		}
		n := o.takeWrites()
		if n == 0 && (resp != nil || sent) {
			n = 1 // a base RoundTripper that does not report writes
		}
		sent = sent || n > 0
		o.attempted(n, sent)
		tries += max(n, 1)
		if v == transient && (unsafe && sent || rewind == nil) {
			v = permanent // a request without a key may have been performed, or the body is gone
		}
		if o != nil && o.hooks.any() {
			o.attemptsDone(ctx, n, began, resp, err, reason)
		}

		if v == success || v == permanent {
			if resp != nil {
				if tries > 1 {
					t.cfg.logger.Info("idem: answered after retries", "idem.key", o.key(), "idem.operation", o.name(),
						"http.response.status_code", resp.StatusCode, "idem.attempts", tries, durationMS("idem.elapsed_ms", time.Since(start)))
				}
				return o.deliver(resp, v), nil
			}
			cause := ErrNotRetryable
			if ctx.Err() != nil {
				cause = context.Cause(ctx)
			}
			return nil, o.stop(cause, err)
		}

		wait, source, why := t.nextWait(ctx, &bo, host, tries, start, resp)
		if why != nil {
			if resp != nil {
				t.cfg.logger.Info("idem: giving up, returning last response", "idem.key", o.key(), "idem.operation", o.name(),
					"http.response.status_code", resp.StatusCode, "idem.attempts", tries, "idem.reason", reason, "idem.stop", why.Error())
				return o.deliver(resp, transient), nil
			}
			return nil, o.stop(why, err)
		}

		errText := ""
		if resp != nil {
			discard(resp)
		} else {
			errText = err.Error()
		}
		o.recordAttempt(statusOf(resp), errText)
		if o != nil && o.hooks.any() {
			o.hooks.retryScheduled(RetryInfo{OperationInfo: o.info(StatePending), Context: ctx, Attempt: o.reported,
				Delay: wait, Reason: reason, Source: source})
		}
		t.cfg.logger.Debug("idem: retrying", "idem.key", o.key(), "idem.operation", o.name(), "http.request.resend_count", o.resends(tries),
			"idem.reason", reason, durationMS("idem.retry.delay_ms", wait), "idem.retry.delay_source", source)
		if err := sleep(ctx, wait); err != nil {
			return nil, o.stop(err, nil)
		}
	}
}

func statusOf(resp *http.Response) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}

// nextWait returns how long to wait before the next attempt and what set
// the wait, or why there is none: attempts used up, total time used up, the
// caller's deadline would pass during the wait (then we stop now rather
// than oversleep), or the host's retry budget is spent.
func (t *Transport) nextWait(ctx context.Context, bo *lazyBackOff, host string, tries int, start time.Time, resp *http.Response) (time.Duration, string, error) {
	p := t.cfg.policy
	if tries >= p.MaxAttempts {
		return 0, "", ErrAttemptsExhausted
	}
	wait, source := p.jitter(bo.NextBackOff()), "backoff"
	if resp != nil {
		if d, src, ok := serverDelay(resp.Header, time.Now()); ok {
			wait, source = min(d, p.RetryAfterCap), src
		}
	}
	now := time.Now()
	if now.Add(wait).Sub(start) > p.MaxElapsed {
		return 0, "", ErrRetryTimeout
	}
	if dl, ok := ctx.Deadline(); ok && now.Add(wait).After(dl) {
		return 0, "", ErrDeadline
	}
	if !t.cfg.budget.withdraw(host) {
		return 0, "", ErrRetryBudget
	}
	return wait, source, nil
}

// roundTripUnkeyed sends a request that carries no key: an idempotent
// method, or a non-idempotent one the caller opted out of keys for.
func (t *Transport) roundTripUnkeyed(req *http.Request) (*http.Response, error) {
	var rewind func() (io.ReadCloser, error)
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		rewind = func() (io.ReadCloser, error) { return req.Body, nil }
	case req.GetBody != nil:
		rewind = someBody(req.GetBody)
	}
	return t.attempts(req.Context(), nil, req, rewind)
}

// checkRedirect is the redirect policy of Client.HTTPClient: it does not
// re-send a keyed request to another URL, and otherwise stops after 10
// redirects as http.Client does by default.
func (t *Transport) checkRedirect(req *http.Request, via []*http.Request) error {
	if t.cfg.keyed[req.Method] && !withoutKey(req.Context()) {
		return http.ErrUseLastResponse
	}
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}

// CloseIdleConnections closes the idle connections of the base transport,
// if it has a CloseIdleConnections method; http.Client's method of the same
// name calls it.
func (t *Transport) CloseIdleConnections() {
	if ci, ok := t.cfg.base.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// idempotent lists the methods RFC 9110 §9.2.2 defines as idempotent.
var idempotent = map[string]bool{
	"": true, http.MethodGet: true, http.MethodHead: true, http.MethodPut: true,
	http.MethodDelete: true, http.MethodOptions: true, http.MethodTrace: true,
}
