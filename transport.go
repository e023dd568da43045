package idem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemgo/idem/internal/fingerprint"
)

// Transport is an http.RoundTripper that makes non-idempotent requests safe
// to retry. Get one from Client.Transport or use Client.HTTPClient.
//
// For a keyed request (POST and PATCH by default) it:
//
//  1. refuses a request that can never be sent (no URL, a scheme other
//     than http or https, no host, a method that is not a token, a header
//     or Host net/http would refuse to write, a body whose length is not
//     its ContentLength);
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
// A request net/http's client made to follow a redirect (its Response is
// set) goes to another host (host and port) than the first request of its
// chain without the secret headers (DefaultSecretHeaders and
// WithSecretHeaders); one that would re-send a keyed request with its body
// (a 307 or 308 answer to a POST) is refused with ErrRedirected, never
// sent under a second key. Client.HTTPClient does not follow the latter.
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

// RoundTrip implements http.RoundTripper. A keyed request becomes an
// operation (operation.go): reserve chooses its key, reads its body and
// journals it, outgoing builds the request to send, and attempts sends it
// until it has an answer or an error. A request without a key takes the
// short path, roundTripUnkeyed, through the same attempts.
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
	if req.Response != nil { // net/http's client follows a redirect
		if keyed {
			closeBody(req)
			return nil, fmt.Errorf("%w: %s %s after %d", ErrRedirected, req.Method, secrets.redactText(req.URL.String()), req.Response.StatusCode)
		}
		req = t.cfg.redirectRequest(req)
	}
	if keyed && !validHeaderName(t.cfg.header) {
		closeBody(req)
		return nil, fmt.Errorf("%w: key header name %s is not an HTTP token", ErrInvalidRequest, quote(t.cfg.header))
	}
	if !keyed {
		if err := t.unkeyedAsked(req); err != nil {
			closeBody(req)
			return nil, err
		}
		return t.roundTripUnkeyed(req)
	}
	o, err := t.j.newOperation(hooksFor(req.Context(), t.cfg.hooks), true)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	// Until the journal holds the operation, an error or a panic ends it
	// here; then its attempts and its answer end it.
	defer func() {
		if !o.journaled() {
			o.end(nil)
		}
	}()
	out, err := t.reserve(o, req)
	if err != nil {
		return nil, err
	}
	return t.attempts(req.Context(), o, out)
}

// reserve journals a keyed request for o and returns the request to send:
// a copy of req with its own header, the key set, and a body that each
// attempt rewinds.
func (t *Transport) reserve(o *operation, req *http.Request) (*http.Request, error) {
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		closeBody(req)
		return nil, err
	}
	key, name, src, err := t.chooseKey(req)
	if err != nil {
		closeBody(req)
		return nil, &Error{Name: name, Cause: ErrInvalidKey, Err: err}
	}
	body, rest, err := readBody(req, t.cfg.maxBody)
	if err != nil {
		return nil, &Error{Name: name, Cause: invalidIf(err), Err: fmt.Errorf("idem: reading request body: %w", err)}
	}

	jurl, redacted := t.cfg.journaledURL(req.URL, &t.j.last)
	header, secrets := t.cfg.journaledHeader(req.Header, &t.j.last)
	var fp [32]byte
	if rest != nil {
		if fp, err = t.largeFingerprint(req, jurl, rest); err != nil {
			cause := invalidIf(err)
			if cause == nil {
				cause = ErrBodyTooLarge
			}
			return nil, &Error{Name: name, Cause: cause, Err: err}
		}
		body = nil
	} else {
		fp = fingerprint.Sum(req.Method, jurl, req.Header, body)
	}
	if f := t.cfg.bodyKeyField(); f != "" {
		if key, src, err = t.keyInBody(o, body, rest != nil, f, key, name, src); err != nil {
			return nil, &Error{Name: name, Cause: ErrInvalidRequest, Err: err}
		}
	}
	matched := false
	mk := t.cfg.matchKey(fp, req)
	if src == keyNew {
		if k, ok := t.j.recent.match(mk); ok {
			key, matched = k, true
		}
	}
	// The journal stamps its state, times, lease and key header (stamp).
	op := Operation{
		Key: key, Name: name, Method: req.Method, URL: jurl, Fingerprint: fp,
		Redacted: redacted || secrets, Unreplayable: rest != nil,
		Header: header, Body: body,
		// The first attempt counts as started in the reservation that
		// makes the operation durable, before it is sent: a crash while it
		// is on the wire cannot hide it (see operation.starting).
		Attempts: 1,
	}
	if req.Host != "" && req.Host != req.URL.Host {
		op.Host = req.Host
	}
	if err := o.begin(ctx, op, mk, matched); err != nil {
		if journalFault(err) {
			t.j.reserveFailed(ctx, o.hooks, &op, err)
		}
		if ie := (*Error)(nil); errors.As(err, &ie) && ie.Cause == ErrOutcomeUnknown {
			t.j.recent.add(mk, ie.Key) // its resend must find the key that may be journaled
		}
		return nil, err
	}
	var large func() (io.ReadCloser, error)
	if rest != nil {
		large = o.verified(someBody(req.GetBody), req.Method, jurl, req.Header, fp)
	}
	// The key travels in the header the operation was journaled with (a
	// re-drive of a record from a Client with another key header), never
	// under a guess; the caller's own key header goes with it.
	h, kh := req.Header, o.rec.KeyHeader
	if kh == "" { // begin made sure the Client names a header then
		kh = t.cfg.header
	}
	if kh = http.CanonicalHeaderKey(kh); kh != t.cfg.header {
		h = withoutHeader(h, t.cfg.header)
	}
	return t.outgoing(o, req, h, kh, large), nil
}

// keyInBody prepares a keyed request for a provider whose key travels in
// the JSON body's member field (Provider.BodyKeyField): a key the body
// holds already is the request's key (it must agree with WithKey or the
// header's, and a named operation's key is the journal's, so a name
// refuses one); otherwise o writes the key chosen into the body before
// it is journaled (o.keyed). The fingerprint stays the caller's body's.
func (t *Transport) keyInBody(o *operation, body []byte, large bool, field, key, name string, src keySource) (string, keySource, error) {
	if large {
		return "", src, fmt.Errorf("idem: the key travels in the body's %s member, and the body is over the journal's limit", quote(field))
	}
	k, has, err := bodyKey(body, field)
	switch {
	case err != nil:
		return "", src, fmt.Errorf("idem: %w", err)
	case !has:
		o.keyed = func(key string) []byte { return withBodyKey(body, field, key) }
		return key, src, nil
	case name != "":
		return "", src, fmt.Errorf("idem: the body's %s member holds a key, and the operation %s has its own: give one of them", quote(field), quote(name))
	case src != keyNew && k != key:
		return "", src, fmt.Errorf("idem: the body's %s member holds key %s, and the request's key is %s", quote(field), quote(k), quote(key))
	}
	if err := t.cfg.checkKey(k); err != nil {
		return "", src, fmt.Errorf("idem: the body's %s member: %w", quote(field), err)
	}
	return k, keyFromHeader, nil
}

// bodyKeyField returns the member of the JSON body the key travels in,
// or "".
func (c *config) bodyKeyField() string {
	if c.provider == nil {
		return ""
	}
	return c.provider.BodyKeyField
}

// outgoing returns the request that o's attempts send, the one place it is
// built, for a call as for Resume: a copy of base (its method, URL, Host
// and context) with the trace that counts the requests written, header h
// with o's key set under keyHeader, and o's journaled body, or for a body
// over the journal's limit, large.
func (t *Transport) outgoing(o *operation, base *http.Request, h http.Header, keyHeader string, large func() (io.ReadCloser, error)) *http.Request {
	// The copy lives in the operation: WithContext is inlined here, and
	// its own copy, only read, stays on the stack.
	o.req = *base.WithContext(o.traced(base.Context()))
	out := &o.req
	o.keyValue[0] = o.rec.Key
	out.Header = outgoingHeader(h, keyHeader, o.keyValue[:])
	out.Body = nil
	if large != nil {
		out.GetBody = large
	} else {
		out.ContentLength = int64(len(o.rec.Body))
		out.GetBody = bodyFunc(o.rec.Body)
	}
	o.rewind = out.GetBody
	return out
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
// again. c is the journaled operation, or the unkeyed call. A keyed
// request is our own copy with a fresh body for every attempt; a request
// without a key is sent as it is first, and rewound for a retry.
//
// If something panics on the way (a hook, the base RoundTripper), the
// call ends before the panic goes on: an operation is left in doubt if a
// request may have reached the server, else failed unsent.
func (t *Transport) attempts(ctx context.Context, c caller, req *http.Request) (resp *http.Response, err error) {
	returned := false
	defer func() {
		if !returned {
			c.stop(ErrNotRetryable, errPanicked)
		}
	}()
	resp, err = t.send(ctx, c, req)
	returned = true
	return resp, err
}

// errPanicked is why an operation ended when a panic went through it.
var errPanicked = errors.New("idem: a panic went through the call (a hook or the base RoundTripper)")

// send is attempts without the panic guard.
func (t *Transport) send(ctx context.Context, c caller, req *http.Request) (*http.Response, error) {
	p := t.cfg.policy
	bo := lazyBackOff{p: p}
	start := time.Now()
	host := req.URL.Host
	key, name := c.names()
	tries := 0
	t.cfg.budget.deposit(host)
	for attempt := 1; ; attempt++ {
		// The first attempt sends req itself (for a keyed request, our
		// own copy); every later attempt sends a copy with a fresh body.
		r := req
		if attempt > 1 {
			r = new(http.Request)
			*r = *req
		}
		b, err := c.body(attempt)
		if err != nil {
			return nil, c.stop(ErrNotRetryable, fmt.Errorf("idem: rewinding the request body: %w", err))
		}
		if b != nil {
			r.Body = b
		}
		c.starting(attempt)
		tr := try{began: time.Now()}
		tr.resp, tr.err = t.cfg.base.RoundTrip(r)
		tr.classify(ctx, t.cfg.classify)
		tr = c.tried(ctx, tr)
		tries += max(tr.writes, 1)
		resp := tr.resp
		if err := c.changed(); err != nil {
			if resp != nil {
				discard(resp)
			}
			return nil, c.stop(ErrBodyChanged, err)
		}

		if tr.v == success || tr.v == permanent || tr.v == performed {
			if resp != nil {
				if tries > 1 {
					t.cfg.logger.Info("idem: answered after retries", "idem.key", key, "idem.operation", name,
						"http.response.status_code", resp.StatusCode, "idem.attempts", tries, durationMS("idem.elapsed_ms", time.Since(start)))
				}
				return c.deliver(resp, tr.v), nil
			}
			cause := ErrNotRetryable
			if ctx.Err() != nil {
				cause = context.Cause(ctx)
			}
			return nil, c.stop(cause, tr.err)
		}

		wait, source, why := t.nextWait(ctx, &bo, host, tries, start, resp)
		if why != nil {
			if resp != nil {
				t.cfg.logger.Info("idem: giving up, returning last response", "idem.key", key, "idem.operation", name,
					"http.response.status_code", resp.StatusCode, "idem.attempts", tries, "idem.reason", tr.reason, "idem.stop", why.Error())
				return c.deliver(resp, tr.v), nil
			}
			return nil, c.stop(why, tr.err)
		}

		if resp != nil {
			discard(resp)
		}
		c.retrying(ctx, tr, wait, source)
		t.cfg.logger.Debug("idem: retrying", "idem.key", key, "idem.operation", name, "http.request.resend_count", c.resends(tries),
			"idem.reason", tr.reason, durationMS("idem.retry.delay_ms", wait), "idem.retry.delay_source", source)
		if err := sleep(ctx, wait); err != nil {
			return nil, c.stop(err, nil)
		}
	}
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

// unkeyedAsked returns an error matching ErrNotKeyed and
// ErrInvalidRequest when a request the Client does not key asks for a key
// or an operation name in its context (and not WithoutKey): sending it
// without either would silently drop the caller's protection.
func (t *Transport) unkeyedAsked(req *http.Request) error {
	ctx := req.Context()
	if withoutKey(ctx) {
		return nil
	}
	what := ""
	if _, ok := ctx.Value(keyContext{}).(string); ok {
		what = "WithKey"
	} else if _, ok := ctx.Value(operationContext{}).(string); ok {
		what = "WithOperation"
	} else {
		return nil
	}
	return fmt.Errorf("%w: %w: %s on a %s request, a method the Client does not key (WithKeyedMethods or the provider's Methods)",
		ErrInvalidRequest, ErrNotKeyed, what, req.Method)
}

// roundTripUnkeyed sends a request that carries no key: an idempotent
// method, or a non-idempotent one the caller opted out of keys for.
// Nothing is journaled; the call is counted only while RoundTrip runs.
func (t *Transport) roundTripUnkeyed(req *http.Request) (*http.Response, error) {
	if !t.j.calls.begin() {
		closeBody(req)
		return nil, fmt.Errorf("idem: client is closing: %w", ErrClosed)
	}
	defer t.j.calls.done()
	u := &unkeyed{unsafe: !idempotent[req.Method]}
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		u.rewind = func() (io.ReadCloser, error) { return req.Body, nil }
	case req.GetBody != nil:
		u.rewind = someBody(req.GetBody)
	}
	return t.attempts(req.Context(), u, req)
}

// unkeyed is the caller of a request without a key. It is retried only
// while that is safe: its body can be rewound, and, for a method that is
// not idempotent, no request may have reached the server.
type unkeyed struct {
	rewind func() (io.ReadCloser, error) // nil: the body cannot be sent twice
	unsafe bool                          // the method is not idempotent
}

func (u *unkeyed) body(n int) (io.ReadCloser, error) {
	if n == 1 {
		return nil, nil
	}
	return u.rewind()
}

func (u *unkeyed) tried(_ context.Context, tr try) try {
	tr.count(0)
	if (tr.v == transient || tr.v == inProgress) && (u.unsafe && tr.sent || u.rewind == nil) {
		tr.v = permanent // it may have been performed, or the body is gone
	}
	return tr
}

func (u *unkeyed) starting(int) {}

func (u *unkeyed) changed() error { return nil }

func (u *unkeyed) retrying(context.Context, try, time.Duration, string) {}

// deliver hands resp over without PerformedHeader, the server's or a
// provider's reading's: a request sent without a key was not performed
// under one (see PerformedHeader).
func (u *unkeyed) deliver(resp *http.Response, _ verdict) *http.Response {
	delete(resp.Header, PerformedHeader)
	return resp
}

func (u *unkeyed) stop(cause, err error) error {
	switch {
	case err == nil:
		return cause
	case cause == nil || errors.Is(err, cause):
		return err
	}
	return fmt.Errorf("%w: %w", cause, err)
}

func (u *unkeyed) names() (key, name string) { return "", "" }

func (u *unkeyed) resends(tries int) int { return tries }

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

// chooseKey returns the key and operation name for a keyed request: WithKey,
// then WithOperation, then the request's key header (in any spelling), then
// a new key. For a named operation the key is a candidate: the journal
// returns the name's key if it has one.
func (t *Transport) chooseKey(req *http.Request) (key, name string, src keySource, err error) {
	ctx := req.Context()
	if k, ok := ctx.Value(keyContext{}).(string); ok {
		return k, "", keyFromContext, t.cfg.checkKey(k)
	}
	if n, ok := ctx.Value(operationContext{}).(string); ok {
		if n == "" || len(n) > maxNameLen {
			return "", "", keyFromName, fmt.Errorf("operation name must be 1 to %d bytes, got %d", maxNameLen, len(n))
		}
		if !utf8.ValidString(n) || strings.IndexByte(n, 0) >= 0 {
			// Every store can keep it (PostgreSQL's text refuses the others).
			return "", "", keyFromName, fmt.Errorf("operation name %s must be valid UTF-8 without NUL bytes", quote(n))
		}
		key, err := t.cfg.newKey()
		return key, n, keyFromName, err
	}
	if k := headerKey(req.Header, t.cfg.header); k != "" {
		if other := otherHeaderKey(req.Header, t.cfg.header, k); other != "" {
			return "", "", keyFromHeader, fmt.Errorf("header %s holds two keys, %s and %s", t.cfg.header, quote(k), quote(other))
		}
		return k, "", keyFromHeader, t.cfg.checkKey(k)
	}
	key, err = t.cfg.newKey()
	return key, "", keyNew, err
}
