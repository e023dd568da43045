package idemserver

import (
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Option configures a Middleware. Options are applied in order over the
// defaults, so a later option overrides an earlier one; a zero or negative
// value where a positive one is needed keeps the default.
type Option func(*config)

// Defaults used when no option says otherwise.
const (
	// DefaultKeyHeader is the request header that carries the key.
	DefaultKeyHeader = "Idempotency-Key"
	// DefaultLease is how long an in-flight key stays locked without a
	// renewal; a live handler renews it every third of it.
	DefaultLease = 30 * time.Second
	// DefaultRetention is how long a stored response is replayed.
	DefaultRetention = 24 * time.Hour
	// DefaultRetryAfter is the wait advertised by 409 and 503 answers.
	DefaultRetryAfter = time.Second
	// DefaultMaxBodyBytes is the largest request body a keyed request may
	// carry; the middleware reads it whole to fingerprint it.
	DefaultMaxBodyBytes = 1 << 20
	// DefaultMaxResponseBytes is the largest response body stored; a
	// larger response is sent, and its key keeps a "done, not kept"
	// record (see Response.NotKept).
	DefaultMaxResponseBytes = 1 << 20
	// DefaultStoreTimeout bounds each call the middleware makes to its
	// Store.
	DefaultStoreTimeout = 5 * time.Second
	// DefaultSweepInterval is how often expired records are swept.
	DefaultSweepInterval = time.Minute
	// ReplayedHeader is the response header set to "true" on a replay.
	ReplayedHeader = "Idempotent-Replayed"
	// StandardWebhookIDHeader is the Standard Webhooks event id header.
	StandardWebhookIDHeader = "Webhook-Id"
)

// defaultReplayHeaders are the response headers stored and replayed unless
// WithReplayHeaders says otherwise.
var defaultReplayHeaders = []string{"Content-Type", "Content-Encoding", "Content-Language", "Location", "ETag", "Last-Modified"}

// DefaultReplayHeaders returns the response headers stored and replayed
// unless WithReplayHeaders says otherwise, in a new slice. Set-Cookie and
// other per-response headers are left out on purpose.
func DefaultReplayHeaders() []string { return append([]string(nil), defaultReplayHeaders...) }

// principalHeaders are response headers that belong to one session or
// principal; WithReplayHeaders refuses them.
var principalHeaders = map[string]bool{
	"Set-Cookie": true, "Set-Cookie2": true, "Authorization": true, "Cookie": true,
	"Www-Authenticate": true, "Proxy-Authenticate": true, "Authentication-Info": true,
	"Proxy-Authentication-Info": true, "Clear-Site-Data": true,
}

type config struct {
	header      string
	principal   func(*http.Request) (string, error)
	single      bool // WithSingleTenant: no principal, on purpose
	verify      WebhookVerifier
	maxBuffered int64 // WithMaxBufferedBytes
	fpHeaders   []string
	replay      []string
	lease       time.Duration
	retention   time.Duration
	retryAfter  time.Duration
	maxBody     int64
	maxResponse int
	storeClient bool
	hookClient  bool // webhook routes store 3xx and 4xx answers
	safeDedupe  bool // GET, HEAD, OPTIONS, TRACE are deduplicated too
	sweepEvery  time.Duration
	timeout     time.Duration
	refused     []string // replay headers WithReplayHeaders refused
	logger      *slog.Logger
	wait        time.Duration // how long a duplicate waits for the first request's answer
	fingerprint func(r *http.Request, body []byte) ([]byte, error)
	onReplay    []func(w http.ResponseWriter, r *http.Request, resp *Response)
	cacheBytes  int // the answer cache's bound; 0: no cache
}

func newConfig(opts []Option) config {
	c := config{
		header:      DefaultKeyHeader,
		replay:      DefaultReplayHeaders(),
		lease:       DefaultLease,
		retention:   DefaultRetention,
		retryAfter:  DefaultRetryAfter,
		maxBody:     DefaultMaxBodyBytes,
		maxResponse: DefaultMaxResponseBytes,
		maxBuffered: DefaultMaxBufferedBytes,
		storeClient: true,
		sweepEvery:  DefaultSweepInterval,
		timeout:     DefaultStoreTimeout,
	}
	for _, o := range opts {
		o(&c)
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// WithKeyHeader sets the request header that carries the key, for APIs
// that use another name ("PayPal-Request-Id"). The default is
// DefaultKeyHeader.
func WithKeyHeader(name string) Option {
	return func(c *config) {
		if name != "" {
			c.header = http.CanonicalHeaderKey(name)
		}
	}
}

// WithPrincipal sets the function that names who sends a request (an API
// key id, a user id). Keys are scoped by principal, method and path, so
// one principal's key never touches another's. When fn returns an error
// the middleware answers 401 Unauthorized and the handler does not run.
// Put authentication before the middleware and have fn return the user or
// account id it put in the request's context. Without a principal
// function Required and Optional panic, unless WithSingleTenant says the
// service has one tenant; CredentialsPrincipal names a principal by a
// digest of the request's credentials, for services without an
// authentication context.
func WithPrincipal(fn func(*http.Request) (string, error)) Option {
	return func(c *config) { c.principal, c.single = fn, false }
}

// WithFingerprintHeaders names request headers that are part of the
// payload fingerprint, besides the body and the query string. A key reused
// with another value of one of them is answered 422.
func WithFingerprintHeaders(names ...string) Option {
	return func(c *config) {
		c.fpHeaders = nil
		for _, n := range names {
			c.fpHeaders = append(c.fpHeaders, http.CanonicalHeaderKey(n))
		}
	}
}

// WithReplayHeaders sets the response headers stored with a response and
// replayed; others are dropped from replays. The default is
// DefaultReplayHeaders(). Headers that belong to one session or principal
// (Set-Cookie, WWW-Authenticate, Authentication-Info, Clear-Site-Data and
// the like) are refused: they are left out, and New logs an error naming
// them. WithPrincipalReplayHeaders adds them for an application that means
// it. Trailers the handler declared and sent are stored and replayed as
// trailers whatever the list holds, except those that belong to a session.
func WithReplayHeaders(names ...string) Option {
	return func(c *config) {
		c.replay, c.refused = nil, nil
		for _, n := range names {
			n = http.CanonicalHeaderKey(n)
			if principalHeaders[n] {
				c.refused = append(c.refused, n)
				continue
			}
			c.replay = append(c.replay, n)
		}
	}
}

// WithPrincipalReplayHeaders adds response headers that belong to one
// session or principal, such as Set-Cookie, to the replayed ones. Keys are
// scoped by principal, so a replay goes to the principal that made the
// request; but a replayed cookie or challenge is the one of the first
// answer, perhaps of another session. Use it only when that is intended.
func WithPrincipalReplayHeaders(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			c.replay = append(c.replay, http.CanonicalHeaderKey(n))
		}
	}
}

// WithSafeMethods says whether requests with a safe method (GET, HEAD,
// OPTIONS, TRACE) are deduplicated by key too. By default (false) they
// pass through to the handler untouched, key or not: a read must see the
// current state, not an answer stored earlier.
func WithSafeMethods(dedupe bool) Option {
	return func(c *config) { c.safeDedupe = dedupe }
}

// WithWebhookClientErrors says whether Webhook routes store 3xx and 4xx
// answers (true) or only 2xx answers (false, the default): a receiver that
// answers 404 because the object its event names is not committed yet
// must see the redelivery.
func WithWebhookClientErrors(store bool) Option {
	return func(c *config) { c.hookClient = store }
}

// WithStoreTimeout bounds each call the middleware makes to its Store
// (claim, renewal, completion, release), so that a database that drops
// packets does not hold a request for the operating system's TCP
// timeout. A claim is bounded by the request's context too, a renewal by
// a third of the lease if that is shorter. A background sweep, off the
// request's path, is bounded by the longer of d and the sweep interval.
// The default is DefaultStoreTimeout.
func WithStoreTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.timeout = d
		}
	}
}

// WithLease sets how long an in-flight key stays locked after the last
// renewal. A live handler renews its lease every third of d; if its
// process dies, the next request with the key runs once d has passed. A
// LocalStore (MemoryStore, BoltStore) holds the key while its handler runs
// whatever the lease says; there d only frees a key whose request ended
// without storing its answer. The default is DefaultLease.
func WithLease(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.lease = d
		}
	}
}

// WithRetention sets how long a stored response is replayed; after that
// the key is new again. The default is DefaultRetention.
func WithRetention(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.retention = d
		}
	}
}

// WithRetryAfter sets the wait advertised in Retry-After by 409 (in
// progress) and 503 (store unavailable) answers, rounded up to whole
// seconds. The default is DefaultRetryAfter.
func WithRetryAfter(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.retryAfter = d
		}
	}
}

// WithMaxBodyBytes sets the largest request body, in bytes, a keyed
// request may carry; a larger one is answered 413 and nothing is stored.
// The default is DefaultMaxBodyBytes.
func WithMaxBodyBytes(n int64) Option {
	return func(c *config) {
		if n > 0 {
			c.maxBody = n
		}
	}
}

// WithMaxResponseBytes sets the largest response body, in bytes, that is
// stored. A larger response is sent to the client as it is written; its
// key keeps a "done, not kept" record, so a retry gets a ProblemNotKept
// answer and never runs the handler again. The default is
// DefaultMaxResponseBytes.
func WithMaxResponseBytes(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.maxResponse = n
		}
	}
}

// WithStoreClientErrors says whether 4xx responses are stored and replayed
// (true, the default, as payment APIs do) or released so that a retry runs
// the handler again. 408, 425 and 429 are never stored: they ask for a
// retry.
func WithStoreClientErrors(store bool) Option {
	return func(c *config) { c.storeClient = store }
}

// WithSweepInterval sets how often the middleware deletes expired records:
// the first request to finish after the interval starts a sweep in a
// goroutine of the middleware's own, off the request's path; Close waits
// for it. A negative d turns sweeping off, for applications that call
// Middleware.Sweep themselves. The default is DefaultSweepInterval.
func WithSweepInterval(d time.Duration) Option {
	return func(c *config) {
		if d != 0 {
			c.sweepEvery = d
		}
	}
}

// WithLogger sets the logger for what the middleware cannot return to
// anyone: a store that failed, a lease that was lost, a response that
// could not be stored. Nil, the default, is silent.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithWait makes a request whose key is held by a request still running
// wait up to d for that request's answer, checking the store at growing
// intervals (from 10 ms to a quarter of d, at most a second), and get the
// answer as a replay instead of 409; if the first request's key is
// released (a 5xx, a panic), the waiting request runs the handler itself.
// When d passes, or the request's context ends, the answer is 409 with
// Retry-After as without it. The default (0) answers 409 at once, as the
// draft's "in progress" answer says.
func WithWait(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.wait = d
		}
	}
}

// WithFingerprint sets what of the request body the payload fingerprint
// covers: fn returns the bytes to fingerprint in its place (a canonical
// form, a part of it), or an error, answered 400 ProblemBadRequest. The
// query string and WithFingerprintHeaders are covered as before. Keys
// stored with another fingerprint function read as used with another
// payload (422) until they expire. Nil, the default, covers the whole
// body, byte for byte.
func WithFingerprint(fn func(r *http.Request, body []byte) ([]byte, error)) Option {
	return func(c *config) { c.fingerprint = fn }
}

// WithFingerprintIgnoring makes the fingerprint cover a JSON body without
// the named members, for bodies that carry a timestamp, a nonce or a
// signature that differs from one retry to the next. A name is a member of
// the top-level object, or a dotted path into nested objects
// ("meta.sent_at"). The rest is fingerprinted in a canonical form
// (members sorted, no insignificant space, numbers as written), so that
// two bodies that differ only in member order or spacing are one
// payload. A body that is not JSON is answered 400. It replaces
// WithFingerprint.
func WithFingerprintIgnoring(names ...string) Option {
	paths := make([][]string, 0, len(names))
	for _, n := range names {
		paths = append(paths, strings.Split(n, "."))
	}
	return WithFingerprint(func(_ *http.Request, body []byte) ([]byte, error) {
		return canonicalJSON(body, paths)
	})
}

// WithOnReplay adds fn to the functions called when the middleware
// answers a request from a stored response (resp, which fn must not
// change; resp.NotKept marks a "done, not kept" record), before the
// answer is written: fn may set headers on w, count replays, log. The
// request's context answers IsReplay with true. Each WithOnReplay adds a
// function; they run in the order given.
func WithOnReplay(fn func(w http.ResponseWriter, r *http.Request, resp *Response)) Option {
	return func(c *config) {
		if fn != nil {
			c.onReplay = append(c.onReplay, fn)
		}
	}
}

// WithAnswerCache keeps the answers this middleware stored in memory, up
// to maxBytes of them (bodies and headers, counted roughly), least
// recently used first out, so that a retry is answered without a store
// call. The store stays the record: an answer enters the cache only once
// the store holds it (Complete, or the request's transaction committed),
// leaves it when it expires or when the middleware's Sweep runs past its
// expiry, and a request the cache cannot answer goes to the store, whose
// answer is not cached (the store does not say when it expires). A stored
// answer never changes before it expires, so replicas with caches of
// their own agree. Zero or a negative maxBytes, the default, means no
// cache.
func WithAnswerCache(maxBytes int) Option {
	return func(c *config) { c.cacheBytes = max(maxBytes, 0) }
}
