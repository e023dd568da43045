package idemserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Middleware makes handlers idempotent by key, following
// draft-ietf-httpapi-idempotency-key-header. Wrap a route with Required or
// Optional (or Webhook for inbound webhooks); any router that takes an
// http.Handler works.
//
// For a request with a key, the middleware reads the whole body (up to
// WithMaxBodyBytes), fingerprints it, and claims the key in the Store
// scoped by principal, method and path:
//
//   - a new key runs the handler under a lease that the middleware renews
//     while the handler runs; its response is stored, then sent;
//   - a key whose handler is still running gets 409 Conflict with
//     Retry-After;
//   - a key with a stored response gets that status, the replay headers
//     and body again, with "Idempotent-Replayed: true";
//   - a key used before with another payload gets 422 Unprocessable
//     Content.
//
// A 5xx, 408, 425 or 429 response, a panic, a hijacked connection, and a
// response over WithMaxResponseBytes are not stored: the key is released
// so that the client may retry. If the store cannot be written the answer
// is 503 and the handler does not run (fail closed). The middleware's own
// answers are application/problem+json documents (RFC 9457).
//
// A stored response is made durable before it is sent, so a client that
// received an answer gets the same one on retry, even after a crash. If
// the process dies while the handler runs, the key stays locked until the
// lease runs out; then the next request runs the handler again, so
// handlers should derive the keys of their own outbound calls with Step.
//
// A Middleware is safe for concurrent use. It does not close its Store.
type Middleware struct {
	store Store
	cfg   config
	now   func() time.Time // time.Now; tests of a crash replace it

	lastSweep atomic.Int64 // unix nanoseconds of the last sweep
	sweeping  atomic.Bool
}

// New returns a Middleware that keeps its keys in store.
func New(store Store, opts ...Option) *Middleware {
	m := &Middleware{store: store, cfg: newConfig(opts), now: time.Now}
	m.lastSweep.Store(m.now().UnixNano())
	return m
}

// route says how a wrapped handler finds its key.
type route struct {
	required bool
	webhook  EventID // nil for Idempotency-Key routes
}

// Required returns h wrapped so that every request must carry a key: one
// without is answered 400 Bad Request. Use it for routes that create or
// charge (POST, PATCH).
func (m *Middleware) Required(h http.Handler) http.Handler {
	return &handler{m: m, h: h, rt: route{required: true}}
}

// Optional returns h wrapped so that a request with a key is handled once
// per key, and a request without one passes through untouched.
func (m *Middleware) Optional(h http.Handler) http.Handler {
	return &handler{m: m, h: h, rt: route{}}
}

// EventID returns the event id of an inbound webhook, given the request
// and its whole body; "" or an error means the request has none and is
// answered 400.
type EventID func(r *http.Request, body []byte) (string, error)

// HeaderEventID returns an EventID that reads the header name.
func HeaderEventID(name string) EventID {
	return func(r *http.Request, _ []byte) (string, error) { return r.Header.Get(name), nil }
}

// Webhook returns h wrapped so that it runs once per event id, for
// receivers of webhooks that their sender delivers at least once. id
// finds the event id; nil means the Standard Webhooks "webhook-id" header
// (see HeaderEventID and JSONEventID for others, such as Stripe's event id
// in the body). Deliveries are scoped by principal and path, not by
// payload: a redelivery with the same id is a duplicate whatever its
// signature or timestamp. A duplicate of a delivery still running gets 409
// with Retry-After, which senders retry; one of a finished delivery gets
// the stored answer. A 5xx or a panic releases the id so the sender's
// retry runs the handler again.
func (m *Middleware) Webhook(h http.Handler, id EventID) http.Handler {
	if id == nil {
		id = HeaderEventID(StandardWebhookIDHeader)
	}
	return &handler{m: m, h: h, rt: route{required: true, webhook: id}}
}

// handler is a wrapped route.
type handler struct {
	m  *Middleware
	h  http.Handler
	rt route
}

// ServeHTTP implements http.Handler.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	var key string
	if h.rt.webhook == nil {
		vals := r.Header.Values(m.cfg.header)
		switch {
		case len(vals) == 0 && !h.rt.required:
			h.h.ServeHTTP(w, r)
			return
		case len(vals) == 0:
			writeProblem(w, http.StatusBadRequest, ProblemMissingKey, m.cfg.header+" is missing",
				"This operation requires an "+m.cfg.header+" header.", 0)
			return
		case len(vals) > 1:
			writeProblem(w, http.StatusBadRequest, ProblemInvalidKey, m.cfg.header+" is invalid",
				"The request carries more than one "+m.cfg.header+" header.", 0)
			return
		}
		var err error
		if key, err = ParseKey(vals[0]); err != nil {
			writeProblem(w, http.StatusBadRequest, ProblemInvalidKey, m.cfg.header+" is invalid", err.Error(), 0)
			return
		}
	}

	principal := ""
	if m.cfg.principal != nil {
		var err error
		if principal, err = m.cfg.principal(r); err != nil {
			writeProblem(w, http.StatusUnauthorized, ProblemUnauthorized, "Unauthorized", "", 0)
			return
		}
	}

	body, err := io.ReadAll(io.LimitReader(r.Body, m.cfg.maxBody+1))
	if err != nil {
		writeProblem(w, http.StatusBadRequest, ProblemBadRequest, "Bad Request", "The request body could not be read.", 0)
		return
	}
	if int64(len(body)) > m.cfg.maxBody {
		writeProblem(w, http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "Request body too large",
			fmt.Sprintf("The request body exceeds %d bytes.", m.cfg.maxBody), 0)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))

	method, fp := r.Method, ""
	if h.rt.webhook != nil {
		method = "webhook" // a delivery may come as POST or PUT; the id is what counts
		id, err := h.rt.webhook(r, body)
		if err == nil {
			key, err = ParseKey(id)
		}
		if err != nil || key == "" {
			writeProblem(w, http.StatusBadRequest, ProblemMissingKey, "Webhook event id is missing or invalid", "", 0)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	} else {
		fp = m.fingerprint(r, body)
	}
	id := scopeID(principal, method, r.URL.Path, key)
	m.serve(w, r, h.h, id, key, fp)
}

// serve claims id and answers from the store or runs next.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, id, key, fp string) {
	log := m.cfg.logger
	now := m.now()
	claim, err := m.store.Begin(r.Context(), Begin{ID: id, Fingerprint: fp, Now: now, LeaseUntil: now.Add(m.cfg.lease)})
	if err != nil {
		log.Error("idemserver: store unavailable; request refused", "id", id, "err", err)
		writeProblem(w, http.StatusServiceUnavailable, ProblemUnavailable, "Service unavailable",
			"The idempotency store cannot be written; the request was not handled.", m.cfg.retryAfter)
		return
	}
	switch claim.State {
	case StateDone:
		replay(w, claim.Response)
		return
	case StateInFlight:
		writeProblem(w, http.StatusConflict, ProblemInProgress, "Request in progress",
			"A request with the same "+m.cfg.header+" is being processed; retry later.", m.cfg.retryAfter)
		return
	case StateMismatch:
		writeProblem(w, http.StatusUnprocessableEntity, ProblemKeyMismatch, m.cfg.header+" is already used",
			"This key was used with a different payload; a key must not be reused across payloads.", 0)
		return
	case StateAcquired:
	default:
		log.Error("idemserver: store returned an unknown state", "state", claim.State)
		writeProblem(w, http.StatusServiceUnavailable, ProblemUnavailable, "Service unavailable", "", m.cfg.retryAfter)
		return
	}
	run := &run{m: m, id: id, token: claim.Token}
	run.do(w, r, next, key)
	m.maybeSweep()
}

// run is one request that holds a key: it owns the lease, the renewer and
// the recorder until the key is completed or released.
type run struct {
	m         *Middleware
	id, token string
	settled   bool // Complete or Release was called
}

func (u *run) do(w http.ResponseWriter, r *http.Request, next http.Handler, key string) {
	m := u.m
	ctx, cancel := context.WithCancelCause(r.Context())
	ctx = context.WithValue(ctx, keyContext{}, keyInfo{id: u.id, key: key})
	stopRenew := u.renew(ctx, cancel)
	rec := &recorder{w: w, max: m.cfg.maxResponse}
	defer func() {
		stopRenew()
		cancel(nil)
		if !u.settled { // the handler panicked
			u.release("handler panicked")
		}
	}()
	next.ServeHTTP(rec, r.WithContext(ctx))
	stopRenew()

	if rec.status == 0 { // the handler wrote nothing: net/http would answer 200
		rec.WriteHeader(http.StatusOK)
	}
	status := rec.status
	switch why := u.keep(status, rec); why {
	case "":
		resp := &Response{Status: status, Header: pick(rec.sent, m.cfg.replay), Body: rec.body.Bytes()}
		u.settled = true
		until := m.now().Add(m.cfg.retention)
		if err := m.store.Complete(context.WithoutCancel(r.Context()), u.id, u.token, resp, until); err != nil {
			m.cfg.logger.Error("idemserver: response not stored; a retry runs the handler again", "id", u.id, "err", err)
			if !errors.Is(err, ErrLockLost) {
				u.settled = false
				u.release("store failed")
			}
		}
	default:
		u.release(why)
	}
	rec.finish()
}

// keep returns why a response is not stored, or "" to store it.
func (u *run) keep(status int, rec *recorder) string {
	switch {
	case rec.hijacked:
		return "connection hijacked"
	case rec.overflow:
		return "response too large to store"
	case status >= 500:
		return "server error"
	case status == http.StatusRequestTimeout || status == http.StatusTooEarly || status == http.StatusTooManyRequests:
		return "retryable status"
	case status >= 400 && !u.m.cfg.storeClient:
		return "client error"
	}
	return ""
}

// release frees the key so a retry runs the handler again.
func (u *run) release(why string) {
	u.settled = true
	err := u.m.store.Release(context.Background(), u.id, u.token)
	if err != nil {
		u.m.cfg.logger.Warn("idemserver: key not released; it frees itself when its lease ends", "id", u.id, "reason", why, "err", err)
		return
	}
	u.m.cfg.logger.Debug("idemserver: key released", "id", u.id, "reason", why)
}

// renew renews the lease every third of it until the returned func is
// called; that func waits for the renewer to stop. A lost lock cancels the
// handler's context with ErrLockLost as its cause.
func (u *run) renew(ctx context.Context, cancel context.CancelCauseFunc) (stop func()) {
	m := u.m
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(m.cfg.lease / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			err := m.store.Renew(context.WithoutCancel(ctx), u.id, u.token, m.now().Add(m.cfg.lease))
			if errors.Is(err, ErrLockLost) {
				m.cfg.logger.Error("idemserver: lease lost while the handler runs", "id", u.id, "err", err)
				cancel(err)
				return
			}
			if err != nil {
				m.cfg.logger.Warn("idemserver: lease not renewed", "id", u.id, "err", err)
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
}

// Sweep deletes the records that expired, as the middleware does by
// itself every sweep interval, and returns how many it deleted.
func (m *Middleware) Sweep(ctx context.Context) (int, error) {
	now := m.now()
	m.lastSweep.Store(now.UnixNano())
	return m.store.Sweep(ctx, now)
}

// maybeSweep sweeps when the interval has passed and no sweep runs.
func (m *Middleware) maybeSweep() {
	if m.cfg.sweepEvery < 0 || m.now().UnixNano()-m.lastSweep.Load() < int64(m.cfg.sweepEvery) {
		return
	}
	if !m.sweeping.CompareAndSwap(false, true) {
		return
	}
	defer m.sweeping.Store(false)
	if n, err := m.Sweep(context.Background()); err != nil {
		m.cfg.logger.Warn("idemserver: sweep failed", "err", err)
	} else if n > 0 {
		m.cfg.logger.Debug("idemserver: swept expired keys", "count", n)
	}
}

// fingerprint returns the hex SHA-256 of the query, the fingerprint
// headers and the body, each length-prefixed.
func (m *Middleware) fingerprint(r *http.Request, body []byte) string {
	d := sha256.New()
	hashString(d, r.URL.RawQuery)
	for _, k := range m.cfg.fpHeaders {
		for _, v := range r.Header.Values(k) {
			hashString(d, k)
			hashString(d, v)
		}
	}
	hashString(d, string(body))
	return hex.EncodeToString(d.Sum(nil))
}

// scopeID returns the store id of a key: the hex SHA-256 of the principal,
// method, path and key, so that no principal's key meets another's and the
// store holds no principal in the clear.
func scopeID(principal, method, path, key string) string {
	d := sha256.New()
	hashString(d, "idemserver/v1")
	hashString(d, principal)
	hashString(d, method)
	hashString(d, path)
	hashString(d, key)
	return hex.EncodeToString(d.Sum(nil))
}

func hashString(d hash.Hash, s string) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(s)))
	d.Write(n[:])
	io.WriteString(d, s)
}

// pick returns the headers of h named in names.
func pick(h http.Header, names []string) http.Header {
	out := make(http.Header, len(names))
	for _, k := range names {
		if v := h.Values(k); len(v) > 0 {
			out[k] = append([]string(nil), v...)
		}
	}
	return out
}

// replay sends a stored response.
func replay(w http.ResponseWriter, resp *Response) {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	h.Set(ReplayedHeader, "true")
	w.WriteHeader(resp.Status)
	w.Write(resp.Body)
}
