package idemserver

import (
	"log/slog"
	"net/http"
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
	// larger response is sent but not stored, and its key is released.
	DefaultMaxResponseBytes = 1 << 20
	// DefaultSweepInterval is how often expired records are swept.
	DefaultSweepInterval = time.Minute
	// ReplayedHeader is the response header set to "true" on a replay.
	ReplayedHeader = "Idempotent-Replayed"
	// StandardWebhookIDHeader is the Standard Webhooks event id header.
	StandardWebhookIDHeader = "Webhook-Id"
)

// DefaultReplayHeaders are the response headers stored and replayed unless
// WithReplayHeaders says otherwise. Set-Cookie and other per-response
// headers are left out on purpose.
var DefaultReplayHeaders = []string{"Content-Type", "Content-Encoding", "Content-Language", "Location", "ETag", "Last-Modified"}

type config struct {
	header      string
	principal   func(*http.Request) (string, error)
	fpHeaders   []string
	replay      []string
	lease       time.Duration
	retention   time.Duration
	retryAfter  time.Duration
	maxBody     int64
	maxResponse int
	storeClient bool
	sweepEvery  time.Duration
	logger      *slog.Logger
}

func newConfig(opts []Option) config {
	c := config{
		header:      DefaultKeyHeader,
		replay:      DefaultReplayHeaders,
		lease:       DefaultLease,
		retention:   DefaultRetention,
		retryAfter:  DefaultRetryAfter,
		maxBody:     DefaultMaxBodyBytes,
		maxResponse: DefaultMaxResponseBytes,
		storeClient: true,
		sweepEvery:  DefaultSweepInterval,
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
// the middleware answers 401 Unauthorized and the handler does not run;
// put authentication before the middleware. The default (nil) puts every
// request in one principal, which suits a single-tenant service only.
func WithPrincipal(fn func(*http.Request) (string, error)) Option {
	return func(c *config) { c.principal = fn }
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
// DefaultReplayHeaders.
func WithReplayHeaders(names ...string) Option {
	return func(c *config) {
		c.replay = nil
		for _, n := range names {
			c.replay = append(c.replay, http.CanonicalHeaderKey(n))
		}
	}
}

// WithLease sets how long an in-flight key stays locked after the last
// renewal. A live handler renews its lease every third of d; if its
// process dies, the next request with the key runs once d has passed. The
// default is DefaultLease.
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
// stored. A larger response is sent to the client as it is written, not
// stored, and its key is released, so a retry runs the handler again. The
// default is DefaultMaxResponseBytes.
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
// the first request to finish after the interval sweeps, after its
// response is decided. A negative d turns sweeping off, for applications
// that call Middleware.Sweep themselves. The default is
// DefaultSweepInterval.
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
