package idemtest

import (
	"fmt"
	"net/http"
	"time"
)

// Option configures a Server. Options are applied in order over the
// defaults, so a later option overrides an earlier one.
type Option func(*config)

// config holds a Server's settings; newConfig fills the defaults.
type config struct {
	header     string
	requireKey bool
	retryAfter time.Duration
	retention  time.Duration
	now        func() time.Time
	rates      FaultRates
	script     func(key string, attempt int) Fault
	delay      time.Duration
}

// Defaults used when no option says otherwise.
const (
	// DefaultKeyHeader is the request header that carries the key.
	DefaultKeyHeader = "Idempotency-Key"
	// DefaultRetryAfter is the wait advertised by 409 and 429 answers.
	DefaultRetryAfter = time.Second
	// DefaultRetention is how long a completed key is remembered.
	DefaultRetention = 24 * time.Hour
	// DefaultFaultDelay is how long a Delay fault holds a request.
	DefaultFaultDelay = 100 * time.Millisecond
)

func newConfig(opts []Option) config {
	c := config{
		header:     DefaultKeyHeader,
		retryAfter: DefaultRetryAfter,
		retention:  DefaultRetention,
		now:        time.Now,
		delay:      DefaultFaultDelay,
	}
	for _, o := range opts {
		o(&c)
	}
	if err := c.rates.validate(); err != nil {
		panic(fmt.Sprintf("idemtest: %v", err))
	}
	return c
}

// WithKeyHeader sets the request header that carries the idempotency key,
// for servers that use another name ("PayPal-Request-Id",
// "Cko-Idempotency-Key"). The default is DefaultKeyHeader.
func WithKeyHeader(name string) Option {
	return func(c *config) { c.header = http.CanonicalHeaderKey(name) }
}

// WithRequireKey makes the server answer 400 Bad Request (a problem
// document) to a POST or PATCH that carries no key, as
// draft-ietf-httpapi-idempotency-key-header §2.7 allows. Without it such
// requests are handled every time they arrive, like a server that ignores
// keys.
func WithRequireKey() Option {
	return func(c *config) { c.requireKey = true }
}

// WithRetryAfter sets the wait advertised in the Retry-After header of 409
// (in progress) and 429 answers. Retry-After carries whole seconds, so d is
// rounded up to the next second; 0 or less sends "Retry-After: 0", which
// suits tests that must not wait. The default is DefaultRetryAfter.
func WithRetryAfter(d time.Duration) Option {
	return func(c *config) { c.retryAfter = max(d, 0) }
}

// WithRetention sets how long the result of a completed key is kept. A
// request arriving after that is handled as new, as a real provider does
// once its key retention has passed. Zero or less keeps no result at all:
// every completed request frees its key. The default is DefaultRetention.
func WithRetention(d time.Duration) Option {
	return func(c *config) { c.retention = d }
}

// WithClock sets the clock used for retention, so that tests can move time
// forward instead of sleeping. now must be safe for concurrent use. The
// default is time.Now. Delay faults use real timers regardless.
func WithClock(now func() time.Time) Option {
	return func(c *config) { c.now = now }
}

// WithFaultRates injects faults at random with the given probabilities.
// NewServer panics if a rate is negative or the rates sum to more than 1.
func WithFaultRates(r FaultRates) Option {
	return func(c *config) { c.rates = r }
}

// WithScript injects the faults fn returns. fn is called once for every
// request with the request's key ("" when it has none) and its attempt
// number for that key, counting from 1. When fn returns NoFault, the
// request is left to the fault rates, if any. fn may be called from several
// goroutines at once.
func WithScript(fn func(key string, attempt int) Fault) Option {
	return func(c *config) { c.script = fn }
}

// WithFaultDelay sets how long a Delay fault holds a request before it is
// handled. The default is DefaultFaultDelay.
func WithFaultDelay(d time.Duration) Option {
	return func(c *config) { c.delay = max(d, 0) }
}
