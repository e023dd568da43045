package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/google/uuid"

	"github.com/idemgo/idem/internal/fingerprint"
)

// Transport is an http.RoundTripper that makes non-idempotent requests safe
// to retry. Get one from Client.Transport or use Client.HTTPClient.
//
// For a keyed request (POST and PATCH by default) it:
//
//  1. clones the request (the caller's request is never modified);
//  2. chooses the key: WithKey, then WithOperation, then a key already on the
//     request's header, then a new random UUIDv7;
//  3. reads the body (at most the body limit) and fingerprints the payload;
//  4. journals key, fingerprint and the replayable request (secret headers
//     removed), and waits until the journal has fsynced them: if the journal
//     fails, nothing is sent;
//  5. sends, classifies the outcome, and retries transient failures with the
//     same key and a byte-identical body, waiting with exponential backoff
//     and full jitter or the server's Retry-After;
//  6. records each attempt and finishes the operation.
//
// It returns the final response as it is, including a 5xx or 429 when
// attempts ran out, and returns an error (an *Error) only when it has no
// response for the caller. An operation whose outcome is unknown (the last
// attempt failed without a response, or the context ended after a request
// went out) stays pending in the journal; Client.Resume finishes it.
//
// What survives a crash: every operation whose reservation returned is in
// the journal with its key and request, so a restarted process resumes it
// with its original key. Attempt counts and finish marks are written
// without waiting for their own fsync; losing one in a crash causes at most
// one resend, which the server answers from its idempotency store.
//
// Requests with other methods carry no key. GET, HEAD, PUT, DELETE, OPTIONS
// and TRACE are idempotent (RFC 9110 §9.2.2) and are retried when their body
// can be rewound (no body, or GetBody set). Other requests without a key are
// retried only when the failure proves nothing reached the server.
//
// Transport is safe for concurrent use. As the RoundTripper contract asks,
// it closes the request body, also on errors. The zero Transport is usable:
// it keeps keys in a MemoryStore and sends through http.DefaultTransport.
type Transport struct {
	once  sync.Once
	store KeyStore
	cfg   config

	flight inflight

	// lastSweep is when finished records were last swept (Unix ns).
	lastSweep atomic.Int64
}

var _ http.RoundTripper = (*Transport)(nil)

// init fills in what a zero Transport lacks.
func (t *Transport) init() {
	t.once.Do(func() {
		if t.store == nil {
			t.store = NewMemoryStore()
		}
		if t.cfg.header == "" {
			t.cfg = newConfig(nil)
		}
		t.lastSweep.Store(time.Now().UnixNano())
	})
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.init()
	if !t.cfg.keyed[req.Method] || withoutKey(req.Context()) {
		return t.roundTripUnkeyed(req)
	}
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		closeBody(req)
		return nil, err
	}

	key, name, err := t.chooseKey(req)
	if err != nil {
		closeBody(req)
		return nil, &Error{Key: key, Name: name, Cause: ErrInvalidKey, Err: err}
	}
	body, rest, err := readBody(req, t.cfg.maxBody)
	if err != nil {
		return nil, &Error{Key: key, Name: name, Err: fmt.Errorf("idem: reading request body: %w", err)}
	}
	if rest != nil {
		return t.roundTripLarge(req, key, name, body, rest)
	}

	op := t.newOperation(req, key, name, body)
	ids, err := t.reserve(ctx, &op)
	if err != nil {
		return nil, err
	}
	defer t.flight.release(true, ids)

	// A shallow copy with its own header: the caller's request is not
	// modified, and its URL and other fields are only read.
	out := new(http.Request)
	*out = *req
	out.Header = req.Header.Clone()
	if out.Header == nil {
		out.Header = make(http.Header, 1)
	}
	out.Header[t.cfg.header] = []string{op.Key}
	return t.send(ctx, &op, out)
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

// chooseKey returns the key and operation name for a keyed request. For a
// named operation the key is a fresh candidate: the journal returns the
// name's existing key if it has one.
func (t *Transport) chooseKey(req *http.Request) (key, name string, err error) {
	ctx := req.Context()
	if k, ok := ctx.Value(keyContext{}).(string); ok {
		return k, "", validKey(k)
	}
	if n, ok := ctx.Value(operationContext{}).(string); ok {
		if n == "" || len(n) > maxNameLen {
			return "", n, fmt.Errorf("operation name must be 1 to %d bytes, got %d", maxNameLen, len(n))
		}
		key, err := newKey()
		return key, n, err
	}
	if k := req.Header.Get(t.cfg.header); k != "" {
		return k, "", validKey(k)
	}
	key, err = newKey()
	return key, "", err
}

// newKey returns a random UUIDv7: random enough to be unguessable, and time
// ordered so the journal's B+tree appends on its rightmost leaf.
func newKey() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("generating key: %w", err)
	}
	return u.String(), nil
}

// newOperation returns the journal record for a keyed request about to be
// sent for the first time.
func (t *Transport) newOperation(req *http.Request, key, name string, body []byte) Operation {
	u := req.URL.String()
	now := time.Now()
	return Operation{
		Key:         key,
		Name:        name,
		Method:      req.Method,
		URL:         u,
		Fingerprint: fingerprint.Sum(req.Method, u, req.Header, body),
		State:       StatePending,
		Created:     now,
		Updated:     now,
		Owner:       t.cfg.owner,
		LeaseUntil:  now.Add(t.cfg.lease),
		Header:      t.journaledHeader(req.Header),
		Body:        body,
	}
}

// journaledHeader returns the headers worth replaying after a crash: all
// but the secret ones and the key header (which is re-added from the key).
func (t *Transport) journaledHeader(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, v := range h {
		if ck := http.CanonicalHeaderKey(k); t.cfg.secret[ck] || ck == t.cfg.header {
			continue
		}
		out[k] = v
	}
	return out
}

// reserve journals op durably, or takes over the journal's existing record
// for its key or name, and marks the operation in flight in this process.
// On success op is the record to send and the caller must release the
// returned ids when done.
func (t *Transport) reserve(ctx context.Context, op *Operation) (flights, error) {
	ids := flightIDs(op)
	if !t.flight.acquire(true, ids) {
		return flights{}, &Error{Key: op.Key, Name: op.Name, Cause: ErrInProgress}
	}
	rec, created, err := t.store.Reserve(ctx, *op)
	if err != nil {
		t.flight.release(true, ids)
		return flights{}, &Error{Key: op.Key, Name: op.Name, Cause: err}
	}
	if created {
		return ids, nil
	}
	if rec.Key != op.Key { // the name already had a key
		own := flights{ids: [3]flightID{{id: rec.Key}}, n: 1}
		if !t.flight.acquire(false, own) {
			t.flight.release(true, ids)
			return flights{}, &Error{Key: rec.Key, Name: rec.Name, State: rec.State, Cause: ErrInProgress}
		}
		ids.add(flightID{id: rec.Key})
	}
	err = t.takeOver(ctx, &rec, op)
	if err != nil {
		t.flight.release(true, ids)
		return flights{}, err
	}
	*op = rec
	return ids, nil
}

// takeOver decides whether an operation already in the journal may be sent
// again for this request: only with the same payload, and, if it finished,
// only within the resend window (beyond it the server may have forgotten
// the key and would perform the action again).
func (t *Transport) takeOver(ctx context.Context, rec, op *Operation) error {
	fail := func(cause error) error {
		return &Error{Key: rec.Key, Name: rec.Name, State: rec.State, LastStatus: rec.LastStatus, Cause: cause}
	}
	if rec.Fingerprint != op.Fingerprint {
		return fail(ErrKeyReused)
	}
	if time.Since(rec.Created) >= t.cfg.resendWindow {
		return fail(ErrExpired)
	}
	if rec.State != StatePending {
		now := time.Now()
		reopened, err := t.store.Acquire(ctx, rec.Key, Lease{Owner: t.cfg.owner, At: now, Until: now.Add(t.cfg.lease)}, op.Header, op.Body)
		if err != nil {
			return fail(err)
		}
		*rec = reopened
	}
	rec.Header, rec.Body = op.Header, op.Body
	return nil
}

// inflight is the set of operations this process is sending, by key and
// by name, so that no operation is sent twice at once: not by two
// calls, nor by a call and Resume. It also counts live calls (RoundTrip,
// not Resume), which lets Resume tell whether a page of pending operations
// it read can have gone stale.
type inflight struct {
	mu   sync.Mutex
	ids  map[flightID]struct{}
	live int    // live calls in flight
	seq  uint64 // live calls ever started
}

// acquire marks ids in flight, all or none, and reports whether it did.
// live says whether this starts a live call.
func (f *inflight) acquire(live bool, fs flights) bool {
	ids := fs.ids[:fs.n]
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		if _, busy := f.ids[id]; busy {
			return false
		}
	}
	if f.ids == nil {
		f.ids = make(map[flightID]struct{})
	}
	for _, id := range ids {
		f.ids[id] = struct{}{}
	}
	if live {
		f.live++
		f.seq++
	}
	return true
}

// release undoes acquire.
func (f *inflight) release(live bool, fs flights) {
	ids := fs.ids[:fs.n]
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		delete(f.ids, id)
	}
	if live {
		f.live--
	}
}

// flightID names an operation in flight: by key, or by name.
type flightID struct {
	name bool
	id   string
}

// flights is the few flightIDs of one operation, kept by value so that
// marking an operation in flight does not allocate.
type flights struct {
	ids [3]flightID
	n   int
}

func (f *flights) add(id flightID) { f.ids[f.n] = id; f.n++ }

// flightIDs returns the ids of op: its key, and its name if it has one.
func flightIDs(op *Operation) flights {
	fs := flights{ids: [3]flightID{{id: op.Key}}, n: 1}
	if op.Name != "" {
		fs.add(flightID{name: true, id: op.Name})
	}
	return fs
}

// quietMark is the state of live calls at one moment.
type quietMark struct {
	live int
	seq  uint64
}

// mark returns the state of live calls now.
func (f *inflight) mark() quietMark {
	f.mu.Lock()
	defer f.mu.Unlock()
	return quietMark{f.live, f.seq}
}

// quietSince reports whether no live call was in flight at m and none has
// started since: then no live call can have changed an operation since.
func (f *inflight) quietSince(m quietMark) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return m.live == 0 && f.seq == m.seq
}

// send runs the attempts of a journaled operation: tmpl is the request to
// send (with the key header set); each attempt gets a fresh reader over
// op.Body. It is shared by RoundTrip and Resume.
func (t *Transport) send(ctx context.Context, op *Operation, tmpl *http.Request) (*http.Response, error) {
	body := op.Body
	tmpl.ContentLength = int64(len(body))
	tmpl.GetBody = func() (io.ReadCloser, error) {
		r := new(bodyReader)
		r.Reset(body)
		return r, nil
	}
	if len(body) == 0 {
		tmpl.GetBody = func() (io.ReadCloser, error) { return http.NoBody, nil }
	}
	return t.attempts(ctx, call{op: op, req: tmpl, rewind: tmpl.GetBody})
}

// call is one logical request for the retry loop.
type call struct {
	// op is the journaled operation, or nil for a request without a key.
	op *Operation
	// req is sent on the first attempt; later attempts send a copy with a
	// body from rewind.
	req *http.Request
	// rewind returns a fresh body; nil means the body cannot be sent twice.
	rewind func() (io.ReadCloser, error)
	// unsafe marks a non-idempotent request without a key: it is retried
	// only when the failure proves nothing reached the server.
	unsafe bool
}

// attempts is the retry loop: send, classify, wait, send again.
func (t *Transport) attempts(ctx context.Context, c call) (*http.Response, error) {
	p := t.cfg.policy
	bo := lazyBackOff{p: p}
	start := time.Now()
	mayHaveSent := false
	t.cfg.budget.deposit(c.req.URL.Host)
	for attempt := 1; ; attempt++ {
		req := c.req
		if attempt == 1 && c.op != nil {
			// The template is the first attempt; later ones copy it.
			b, err := c.rewind()
			if err != nil {
				return nil, t.stop(c, 0, 0, 0, false, ErrNotRetryable, err)
			}
			req.Body = b
		} else if attempt > 1 {
			var err error
			if req, err = c.attemptRequest(); err != nil {
				return nil, t.stop(c, attempt-1, 0, 0, mayHaveSent, ErrNotRetryable, err)
			}
		}
		resp, err := t.cfg.base.RoundTrip(req)

		var v verdict
		var reason string
		sent := true
		if err != nil {
			v, reason, sent = classifyError(err)
			if ctx.Err() != nil {
				v, reason = permanent, "context done"
			}
		} else {
			v, reason = classifyResponse(resp)
		}
		mayHaveSent = mayHaveSent || sent
		if v == transient && c.unsafe && sent {
			v = permanent // a request without a key may have been performed
		}
		if v == transient && c.rewind == nil {
			v = permanent // the body cannot be sent again
		}

		if v == success || v == permanent {
			if resp != nil {
				t.finish(c, v, resp.StatusCode, "", 1)
				return resp, nil
			}
			cause := ErrNotRetryable
			if ctx.Err() != nil {
				cause = context.Cause(ctx)
			}
			return nil, t.stop(c, attempt, 1, 0, mayHaveSent, cause, err)
		}

		wait, why := t.nextWait(ctx, &bo, c.req.URL.Host, attempt, start, resp)
		if why != nil {
			if resp != nil {
				t.log().LogAttrs(ctx, slog.LevelInfo, "idem: giving up, returning last response",
					slog.String("key", c.key()), slog.Int("attempt", attempt), slog.String("reason", reason), slog.String("stop", why.Error()))
				t.finish(c, permanent, resp.StatusCode, "", 1)
				return resp, nil
			}
			return nil, t.stop(c, attempt, 1, 0, mayHaveSent, why, err)
		}

		status, errText := 0, ""
		if resp != nil {
			status = resp.StatusCode
			discard(resp)
		} else {
			errText = err.Error()
		}
		t.attempted(c, status, errText)
		t.log().LogAttrs(ctx, slog.LevelDebug, "idem: retrying",
			slog.String("key", c.key()), slog.Int("attempt", attempt), slog.String("reason", reason), slog.Duration("wait", wait))
		if err := sleep(ctx, wait); err != nil {
			return nil, t.stop(c, attempt, 0, status, mayHaveSent, err, nil)
		}
	}
}

// attemptRequest returns the request for one attempt: a shallow copy of
// the template with a fresh body.
func (c call) attemptRequest() (*http.Request, error) {
	r := new(http.Request)
	*r = *c.req
	if c.rewind != nil {
		b, err := c.rewind()
		if err != nil {
			return nil, err
		}
		r.Body = b
	}
	return r, nil
}

func (c call) key() string {
	if c.op != nil {
		return c.op.Key
	}
	return ""
}

// nextWait returns how long to wait before the next attempt, or why there
// is none: attempts used up, total time used up, or the caller's deadline
// would pass during the wait (then we stop now rather than oversleep), or
// the host's retry budget is spent.
func (t *Transport) nextWait(ctx context.Context, bo *lazyBackOff, host string, attempt int, start time.Time, resp *http.Response) (time.Duration, error) {
	p := t.cfg.policy
	if attempt >= p.MaxAttempts {
		return 0, ErrAttemptsExhausted
	}
	wait := p.jitter(bo.NextBackOff())
	if resp != nil {
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			wait = min(d, p.RetryAfterCap)
		}
	}
	now := time.Now()
	if now.Add(wait).Sub(start) > p.MaxElapsed {
		return 0, ErrRetryTimeout
	}
	if dl, ok := ctx.Deadline(); ok && now.Add(wait).After(dl) {
		return 0, ErrDeadline
	}
	if !t.cfg.budget.withdraw(host) {
		return 0, ErrRetryBudget
	}
	return wait, nil
}

// stop ends a call that has no response for the caller. If a request may
// have reached the server the operation stays pending (in doubt) for
// Resume; otherwise it is finished as failed. unrecorded counts the
// attempts not yet recorded (0 or 1).
func (t *Transport) stop(c call, attempts, unrecorded, status int, mayHaveSent bool, cause, err error) error {
	if c.op == nil {
		if err == nil {
			return cause
		}
		if cause == nil || errors.Is(err, cause) {
			return err
		}
		return fmt.Errorf("%w: %w", cause, err)
	}
	e := &Error{Key: c.op.Key, Name: c.op.Name, Attempts: attempts, LastStatus: status, Cause: cause, Err: err, State: StatePending}
	errText := ""
	if err != nil {
		errText = err.Error()
	} else if cause != nil {
		errText = cause.Error()
	}
	switch {
	case !mayHaveSent:
		e.State = StateFailed
		t.finish(c, permanent, status, "not sent: "+errText, unrecorded)
	case unrecorded > 0:
		t.attempted(c, status, errText)
	}
	return e
}

// attempted records one attempt's outcome; the operation stays pending.
func (t *Transport) attempted(c call, status int, errText string) {
	if c.op == nil {
		return
	}
	if err := t.store.Attempt(context.Background(), c.op.Key, Attempt{Sent: 1, Status: status, Err: errText}); err != nil {
		t.log().Warn("idem: recording attempt", "key", c.op.Key, "err", err)
	}
}

// finish records the operation's final outcome; unrecorded counts the
// attempts not yet recorded with attempted.
func (t *Transport) finish(c call, v verdict, status int, errText string, unrecorded int) {
	if c.op == nil {
		return
	}
	state := StateFailed
	if v == success {
		state = StateSucceeded
	}
	out := Outcome{State: state, Status: status, Err: errText, Sent: unrecorded}
	if err := t.store.Finish(context.Background(), c.op.Key, out); err != nil {
		t.log().Warn("idem: finishing operation", "key", c.op.Key, "err", err)
	}
	t.maybeSweep()
}

// sweepEvery is how often a busy Transport sweeps finished records whose
// retention has passed, so that a journal (above all a MemoryStore) does
// not grow without bound in a process that never calls Resume.
const sweepEvery = time.Hour

// maybeSweep starts a sweep in the background if the last one was more
// than sweepEvery ago. One finishing request in an hour pays for starting
// a goroutine; none waits for the sweep.
func (t *Transport) maybeSweep() {
	last := t.lastSweep.Load()
	now := time.Now()
	if now.Sub(time.Unix(0, last)) < sweepEvery || !t.lastSweep.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	go func() {
		n, err := t.store.Sweep(context.Background(), now.Add(-t.cfg.retention))
		switch {
		case errors.Is(err, ErrClosed):
		case err != nil:
			t.log().Warn("idem: sweeping finished operations", "err", err)
		default:
			t.log().Debug("idem: swept finished operations", "count", n)
		}
	}()
}

// roundTripUnkeyed sends a request that carries no key: an idempotent
// method, or a non-idempotent one the caller opted out of keys for.
func (t *Transport) roundTripUnkeyed(req *http.Request) (*http.Response, error) {
	c := call{req: req, unsafe: !idempotent[req.Method]}
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		c.rewind = func() (io.ReadCloser, error) { return req.Body, nil }
	case req.GetBody != nil:
		c.rewind = req.GetBody
	}
	return t.attempts(req.Context(), c)
}

// roundTripLarge handles a keyed request whose body is over the journal's
// limit: it fails with ErrBodyTooLarge, or, if the Client allows it, sends
// the request with its key but without journaling it (no crash recovery),
// retrying only if the request can rewind its body.
func (t *Transport) roundTripLarge(req *http.Request, key, name string, head []byte, rest io.ReadCloser) (*http.Response, error) {
	if !t.cfg.sendLarge {
		rest.Close()
		return nil, &Error{Key: key, Name: name, Cause: ErrBodyTooLarge,
			Err: fmt.Errorf("body is larger than %d bytes", t.cfg.maxBody)}
	}
	t.log().Warn("idem: sending a large body without journaling it", "key", key)
	out := req.Clone(req.Context())
	out.Header.Set(t.cfg.header, key)
	out.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), rest), rest}
	return t.attempts(req.Context(), call{req: out, rewind: req.GetBody})
}

func (t *Transport) log() *slog.Logger { return t.cfg.logger }

// idempotent lists the methods RFC 9110 §9.2.2 defines as idempotent.
var idempotent = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPut: true,
	http.MethodDelete: true, http.MethodOptions: true, http.MethodTrace: true,
}

// maxKeyLen and maxNameLen bound keys and operation names.
const (
	maxKeyLen  = 255
	maxNameLen = 1024
)

// validKey checks that k can be sent as a header value and stored.
func validKey(k string) error {
	if k == "" || len(k) > maxKeyLen {
		return fmt.Errorf("key must be 1 to %d bytes, got %d", maxKeyLen, len(k))
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return fmt.Errorf("key has a byte 0x%02x that is not visible ASCII", k[i])
		}
	}
	return nil
}

// readBody reads a request body of at most limit bytes and closes it. If
// the body is larger, it returns the bytes read so far and the unread rest
// (still open).
func readBody(req *http.Request, limit int64) (body []byte, rest io.ReadCloser, err error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil, nil
	}
	if req.ContentLength > limit {
		return nil, req.Body, nil
	}
	if req.ContentLength > 0 {
		// The length is known: read into one buffer of exactly that size.
		body = make([]byte, req.ContentLength)
		_, err = io.ReadFull(req.Body, body)
		if err == nil {
			var extra [1]byte
			if n, _ := io.ReadFull(req.Body, extra[:]); n > 0 {
				err = fmt.Errorf("body is longer than its ContentLength %d", req.ContentLength)
			}
		}
		if err != nil {
			req.Body.Close()
			return nil, nil, err
		}
		return body, nil, req.Body.Close()
	}
	body, err = io.ReadAll(io.LimitReader(req.Body, limit+1))
	if err != nil {
		req.Body.Close()
		return nil, nil, err
	}
	if int64(len(body)) > limit {
		return body, req.Body, nil
	}
	return body, nil, req.Body.Close()
}

// closeBody closes a request's body, as a RoundTripper must even on errors.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// discard drains a little of a response body, so that the connection can
// be reused, and closes it.
func discard(resp *http.Response) {
	io.CopyN(io.Discard, resp.Body, 4<<10)
	resp.Body.Close()
}

// sleep waits for d or until ctx is done, and then returns its cause.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return context.Cause(ctx)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// lazyBackOff creates the backoff schedule on the first retry only, so that
// a request that needs no retry does not pay for it.
type lazyBackOff struct {
	p  RetryPolicy
	bo *backoff.ExponentialBackOff
}

// NextBackOff returns the next wait bound of the schedule.
func (l *lazyBackOff) NextBackOff() time.Duration {
	if l.bo == nil {
		l.bo = l.p.newBackOff()
	}
	return l.bo.NextBackOff()
}

// bodyReader is a journaled body read by one attempt: a bytes.Reader that
// closes, in one allocation.
type bodyReader struct{ bytes.Reader }

// Close implements io.Closer.
func (*bodyReader) Close() error { return nil }
