package idemserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/internal/readall"
	"github.com/idemgo/idem/internal/wait"
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
//     Retry-After (with WithWait, after waiting that long for its answer,
//     which it gets as a replay if it comes in time);
//   - a key with a stored response gets that status, the replay headers
//     and body again, with "Idempotent-Replayed: true";
//   - a key used before with another payload gets 422 Unprocessable
//     Content.
//
// What is stored is what went on the wire, by net/http's rules: the
// header as it stood when the status was written (a handler's later
// changes reach neither the client nor the store), the trailers sent
// after the body (replayed as trailers), the final status. Informational
// answers (103 Early Hints) go out at once and are not replayed; 101
// Switching Protocols is final, and leaves a "done, not kept" record.
//
// Requests with a safe method (GET, HEAD, OPTIONS, TRACE) pass through
// untouched unless WithSafeMethods says otherwise.
//
// No 2xx that a retry could contradict leaves the middleware:
//
//   - A 5xx, 408, 425 or 429 response or a panic before anything was
//     sent is not stored: the key is released so that the client may
//     retry (on Webhook routes, every answer but a 2xx is released, see
//     WithWebhookClientErrors).
//   - A response is stored, durably, before it is sent, so a client that
//     received an answer gets the same one on retry, even after a crash.
//     If it cannot be stored, the client gets 503 (ProblemNotStored)
//     instead and the key stays locked until its lease lapses (or, when
//     the request's transaction rolled back for certain, ErrRolledBack,
//     is released at once: nothing of the handler's remains).
//   - A response over WithMaxResponseBytes, a hijacked connection, a 101
//     Switching Protocols, a stream that failed or panicked after its
//     first flush: the handler
//     ran and the client saw (part of) its answer, so the key keeps a
//     "done, not kept" record and a retry gets 409 ProblemNotKept, never
//     a second run.
//   - A flushed (streamed) response is stored when the handler returns,
//     before its end goes out; if it cannot be stored the connection is
//     aborted, so the client sees a broken response, not a complete one
//     (unless the handler set Content-Length and wrote it all).
//
// The middleware renews the lease every third of it while the handler
// runs. When renewals fail for longer than the lease minus a margin (a
// quarter of it), the handler's context is cancelled with a cause matching
// ErrLockLost, before another replica may take the key; its answer is not
// stored (the store refuses it too) and the client gets 503. If the
// process dies while the handler runs, the key stays locked until the
// lease runs out; then the next request runs the handler again, so
// handlers should derive the keys of their own outbound calls with Step,
// and keep their own writes in the request's transaction when the Store
// is a TxStore (pgstore.Tx).
//
// What the middleware buffers for keyed requests in flight (their bodies
// and answers) is bounded by WithMaxBufferedBytes: a request that does
// not fit gets 503 with Retry-After before its body is read.
//
// If the store cannot be reached when the key is claimed the answer is 503
// and the handler does not run (fail closed). Every store call is bounded
// by WithStoreTimeout. The middleware's own answers are complete
// application/problem+json documents (RFC 9457).
//
// A Middleware is safe for concurrent use. Close stops its background
// sweeps; it does not close its Store.
type Middleware struct {
	store Store
	cfg   config
	now   func() time.Time // time.Now; tests of a crash replace it
	cache *answerCache     // nil without WithAnswerCache

	lastSweep atomic.Int64 // unix nanoseconds of the last sweep
	buffered  budget       // bytes reserved by keyed requests in flight
	sweeping  atomic.Bool

	mu     sync.Mutex
	closed bool
	sweeps sync.WaitGroup
	stop   context.Context // cancelled by Close
	cancel context.CancelFunc
}

// New returns a Middleware that keeps its keys in store.
func New(store Store, opts ...Option) *Middleware {
	m := &Middleware{store: store, cfg: newConfig(opts), now: time.Now}
	m.cache = newAnswerCache(m.cfg.cacheBytes)
	m.stop, m.cancel = context.WithCancel(context.Background())
	m.lastSweep.Store(m.now().UnixNano())
	if len(m.cfg.refused) > 0 {
		m.cfg.logger.Error("idemserver: replay headers refused: they belong to one session or principal (see WithPrincipalReplayHeaders)",
			"headers", m.cfg.refused)
	}
	return m
}

// Close stops the middleware's background sweeps and waits for one that
// runs: its context is cancelled, and Close waits for it at most the store
// timeout (WithStoreTimeout). A sweep still running then (a store that does
// not honour its context) goes on in the background, and Close returns an
// error that says so and matches context.DeadlineExceeded; otherwise it
// returns nil. Requests served after Close are still handled, but no
// longer sweep. Close does not close the Store.
func (m *Middleware) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.timeout)
	defer cancel()
	if err := wait.For(ctx, "a sweep", wait.Group(&m.sweeps)); err != nil {
		return fmt.Errorf("idemserver: close: %w", err)
	}
	return nil
}

// route says how a wrapped handler finds its key.
type route struct {
	required bool
	webhook  EventID // nil for Idempotency-Key routes
}

// Required returns h wrapped so that every request must carry a key: one
// without is answered 400 Bad Request. Use it for routes that create or
// charge (POST, PATCH). It panics if the middleware has neither a
// principal function (WithPrincipal) nor WithSingleTenant.
func (m *Middleware) Required(h http.Handler) http.Handler {
	m.checkScoped("Required")
	return &handler{m: m, h: h, rt: route{required: true}}
}

// Optional returns h wrapped so that a request with a key is handled once
// per key, and a request without one passes through untouched. It panics
// if the middleware has neither a principal function (WithPrincipal) nor
// WithSingleTenant.
func (m *Middleware) Optional(h http.Handler) http.Handler {
	m.checkScoped("Optional")
	return &handler{m: m, h: h, rt: route{}}
}

// EventID returns the event id of an inbound webhook, given the request
// and its whole body. "" means the delivery has none, and is answered 400
// ProblemMissingKey; an error, or an id ParseKey refuses, means it is
// malformed, and is answered 400 ProblemInvalidKey.
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
// the stored answer. Only 2xx answers are stored by default (see
// WithWebhookClientErrors): any other answer or a panic releases the id so
// the sender's retry runs the handler again.
//
// A delivery is verified (WithWebhookVerify) before its id is read: one
// that fails gets 401 and counts for nothing. Without a verifier, the id
// alone counts: a forged delivery with a real event's id gets the stored
// answer, or, arriving first, leaves its own under the id, and the real
// delivery is never handled. Webhook routes do not panic without a
// principal function: the sender's signature scopes them.
func (m *Middleware) Webhook(h http.Handler, id EventID, opts ...WebhookOption) http.Handler {
	if id == nil {
		id = HeaderEventID(StandardWebhookIDHeader)
	}
	return &handler{m: m, h: m.webhookHandler(h, opts), rt: route{required: true, webhook: id}}
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
		if !m.cfg.safeDedupe && safeMethod(r.Method) {
			h.h.ServeHTTP(w, r)
			return
		}
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
			writeProblem(w, http.StatusUnauthorized, ProblemUnauthorized, "Unauthorized",
				"The request's principal could not be established.", 0)
			return
		}
	}

	reserved, ok := m.reserve(w, r)
	if !ok {
		return // before the body is read
	}
	defer m.buffered.give(reserved)

	// On a key route the body is read after the fingerprint's prefix, so
	// that the fingerprint is one SHA-256 over one buffer.
	var space [256]byte
	pre := space[:0]
	if h.rt.webhook == nil {
		pre = m.fingerprintPrefix(pre, r)
	}
	prefix := len(pre)
	buf, err := readBody(r.Body, pre, m.cfg.maxBody, r.ContentLength)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, ProblemBadRequest, "Bad Request", "The request body could not be read.", 0)
		return
	}
	body := buf[prefix+8:]
	if int64(len(body)) > m.cfg.maxBody {
		writeProblem(w, http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "Request body too large",
			fmt.Sprintf("The request body exceeds %d bytes.", m.cfg.maxBody), 0)
		return
	}
	br := newBodyReader(body)
	r.Body = br

	method, fp := r.Method, ""
	if h.rt.webhook != nil {
		method = "webhook" // a delivery may come as POST or PUT; the id is what counts
		if !m.verifyDelivery(w, r, body) {
			return // before the id is read: a forged delivery counts for nothing
		}
		br.Reset(body)
		id, err := h.rt.webhook(r, body)
		if err == nil && id == "" {
			writeProblem(w, http.StatusBadRequest, ProblemMissingKey, "Webhook event id is missing",
				"The delivery carries no event id.", 0)
			return
		}
		if err == nil {
			key, err = ParseKey(id)
		}
		if err != nil {
			writeProblem(w, http.StatusBadRequest, ProblemInvalidKey, "Webhook event id is invalid",
				"The delivery's event id is invalid: "+err.Error(), 0)
			return
		}
		br.Reset(body) // for the handler, whatever id read
		r.Body = br
	} else if m.cfg.fingerprint != nil {
		fb, err := m.cfg.fingerprint(r, body)
		if err != nil {
			writeProblem(w, http.StatusBadRequest, ProblemBadRequest, "Bad Request",
				"The request body cannot be fingerprinted: "+err.Error(), 0)
			return
		}
		b := make([]byte, 0, prefix+8+len(fb))
		b = binary.BigEndian.AppendUint64(append(b, buf[:prefix]...), uint64(len(fb)))
		fp = hexSum(append(b, fb...))
	} else {
		binary.BigEndian.PutUint64(buf[prefix:], uint64(len(body)))
		fp = hexSum(buf)
	}
	id := scopeID(principal, method, scopePath(r.URL.Path), key)
	m.serve(w, r, h, id, key, fp)
}

// readBody returns prefix, 8 bytes for the body's length (zero; the
// caller fills them in) and the body, at most limit+1 bytes of it: a
// longer body is cut there for the caller to refuse. size is the body's
// ContentLength (-1 if unknown), which sizes the buffer so that a body of
// known length up to maxPresize is read into one allocation; a larger one
// grows the buffer as its bytes arrive, so that a client cannot make the
// server allocate by announcing a length it never sends.
func readBody(body io.Reader, prefix []byte, limit, size int64) ([]byte, error) {
	n := int64(512)
	if size >= 0 {
		n = min(size, limit, maxPresize) + 1 // +1: room for the read that finds the end
	}
	b := make([]byte, len(prefix)+8, len(prefix)+8+int(n))
	copy(b, prefix)
	if body == nil {
		return b, nil
	}
	return readall.Append(b, body, int64(len(b))+limit+1) // no more than limit+1 bytes
}

// maxPresize is the largest body readBody allocates for before reading it.
const maxPresize = 64 << 10

// bodyReader is a request body read into memory, as the handler gets it.
type bodyReader struct{ bytes.Reader }

func newBodyReader(b []byte) *bodyReader {
	r := new(bodyReader)
	r.Reset(b)
	return r
}

// Close implements io.Closer.
func (*bodyReader) Close() error { return nil }

// safeMethod reports whether method is safe by RFC 9110 §9.2.1.
func safeMethod(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// fingerprintPrefix appends to b what the fingerprint covers before the
// body: the query and the fingerprint headers, each length-prefixed. The
// fingerprint is the hex SHA-256 of that, the body's length and the body.
func (m *Middleware) fingerprintPrefix(b []byte, r *http.Request) []byte {
	b = appendString(b, r.URL.RawQuery)
	for _, k := range m.cfg.fpHeaders {
		for _, v := range r.Header.Values(k) {
			b = appendString(appendString(b, k), v)
		}
	}
	return b
}

// scopeID returns the store id of a key: the hex SHA-256 of the principal,
// method, path and key, each length-prefixed, so that no principal's key
// meets another's and the store holds no principal in the clear.
func scopeID(principal, method, path, key string) string {
	var space [256]byte
	b := appendString(space[:0], "idemserver/v1")
	b = appendString(b, principal)
	b = appendString(b, method)
	b = appendString(b, path)
	return hexSum(appendString(b, key))
}

// appendString appends s to b after its length, 8 bytes big-endian.
func appendString(b []byte, s string) []byte {
	return append(binary.BigEndian.AppendUint64(b, uint64(len(s))), s...)
}

// hexSum returns the SHA-256 of b in lower-case hex.
func hexSum(b []byte) string {
	sum := sha256.Sum256(b)
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], sum[:])
	return string(out[:])
}

// pick returns the headers of h named in names. The values are h's own
// slices, not copies: h is the recorder's copy of the header as it was
// sent, and stores copy what they keep.
func pick(h http.Header, names []string) http.Header {
	out := make(http.Header, len(names))
	for _, k := range names {
		if v := h.Values(k); len(v) > 0 {
			out[k] = slices.Clip(v)
		}
	}
	return out
}
