package idem

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Option configures a Client. Options apply in order; each changes only
// what it names, so they compose.
type Option func(*config)

// config is what Options set. newConfig fills in the defaults.
type config struct {
	logger        *slog.Logger
	hooks         hookList
	base          http.RoundTripper
	policy        RetryPolicy
	header        string
	headerSet     bool // header was named (WithKeyHeader, WithProvider), not left at DefaultHeader
	keyed         map[string]bool
	secret        map[string]bool
	secretQuery   map[string]bool
	maxBody       int64
	sendLarge     bool
	resendWindow  time.Duration
	matchWindow   time.Duration
	matchLimit    int
	volatile      map[string]bool
	principal     func(*http.Request) string
	retention     time.Duration
	prepare       func(*http.Request) error
	resumeWorkers int
	resumeEvery   time.Duration
	resumeFn      func(Operation, *http.Response, error)
	budget        *retryBudget
	owner         string
	lease         time.Duration
	provider      *Provider // set by WithProvider
}

// Defaults of the options.
const (
	// DefaultHeader is the request header that carries the key.
	DefaultHeader = "Idempotency-Key"
	// DefaultMaxBodySize is the largest request body that is journaled.
	DefaultMaxBodySize = 1 << 20
	// DefaultResendWindow is how long after its creation an operation may
	// be sent again: below the 24 h that Stripe and Checkout.com keep keys.
	DefaultResendWindow = 23 * time.Hour
	// DefaultRetention is how long finished operations stay in the journal:
	// long enough to refuse a reused key and to answer a re-drive for as
	// long as the server may still honour the key (24 h at Stripe), with
	// an hour to spare.
	DefaultRetention = 25 * time.Hour
	// DefaultLease is how long an operation stays claimed by the process
	// sending it without a renewal. A live call renews it.
	DefaultLease = 30 * time.Second
	// DefaultResendMatchWindow is how long after a call ended without a
	// definite answer its caller received the same call with no key of its
	// own is taken for its resend and reuses its key.
	DefaultResendMatchWindow = time.Minute
	// DefaultResendMatchLimit is how many calls without a definite answer
	// the resend match index holds at most (see WithResendMatchLimit).
	DefaultResendMatchLimit = 100_000
)

// DefaultMaxIdleConnsPerHost is how many idle connections per host the
// default base transport keeps (net/http's http.DefaultTransport keeps 2).
const DefaultMaxIdleConnsPerHost = 64

// defaultBase returns the process's default base transport. With
// net/http's DefaultTransport, at more than two calls in flight to one
// host every answer but two closes its connection and the next call dials
// again: at 32 in flight that cost idem about 3× bare net/http's CPU per
// request in a user-shaped harness whose bare client kept 256 idle
// connections (BENCHMARKS.md). A retrying client is the one that sends
// bursts to one host, so its default keeps more. The clone is taken once:
// changes made to http.DefaultTransport after the first Client is made do
// not reach it; pass WithBaseTransport(http.DefaultTransport) for that.
var defaultBase = sync.OnceValue(func() http.RoundTripper {
	t, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return http.DefaultTransport // replaced by the application: use it as it is
	}
	t = t.Clone()
	t.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	return t
})

func newConfig(opts []Option) config {
	c := config{
		base:          defaultBase(),
		header:        DefaultHeader,
		keyed:         map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		maxBody:       DefaultMaxBodySize,
		resendWindow:  DefaultResendWindow,
		matchWindow:   DefaultResendMatchWindow,
		retention:     DefaultRetention,
		resumeWorkers: 8,
		lease:         DefaultLease,
	}
	c.volatile = make(map[string]bool, len(defaultVolatile))
	for _, h := range defaultVolatile {
		c.volatile[http.CanonicalHeaderKey(h)] = true
	}
	c.secret, c.secretQuery = defaultSecrets() // see secrets.go
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	if c.base == nil {
		c.base = defaultBase()
	}
	c.policy = c.policy.withDefaults()
	if c.owner == "" {
		host, _ := os.Hostname()
		c.owner = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), uuid.NewString()[:8])
	}
	c.applyProvider() // after every option: the provider's retention bounds the window
	// A name or key must outlive the window in which it may be sent again.
	c.retention = max(c.retention, c.resendWindow+RetentionMargin)
	return c
}

// journalPolicy is the part of the configuration that travels with the
// journal.
func (c *config) journalPolicy() Policy {
	return Policy{KeyHeader: c.header, ResendWindow: c.resendWindow, Retention: c.retention, MatchWindow: c.matchWindow}
}

// WithLogger sets the logger for what idem cannot return to a caller:
// retries at Debug, operations left in doubt at Warn, journal failures at
// Error. Nil, the default, is silent. idem never logs an error that it
// also returns, with one exception: a journal write that failed is logged
// even when its caller gets the error too, because it concerns the
// operator of the journal more than the caller.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithHooks adds callbacks for every operation of the Client. Each
// WithHooks adds to the hooks of those before it (see Hooks); nil adds
// nothing.
func WithHooks(h *Hooks) Option {
	return func(c *config) {
		if h != nil {
			c.hooks = append(c.hooks, h)
		}
	}
}

// WithBaseTransport sets the RoundTripper that sends each attempt. The
// default is one transport shared by every Client of the process: a clone
// of http.DefaultTransport, taken when the first Client is made, that
// keeps up to DefaultMaxIdleConnsPerHost idle connections per host
// instead of net/http's 2 (see defaultBase).
func WithBaseTransport(rt http.RoundTripper) Option { return func(c *config) { c.base = rt } }

// WithRetryPolicy sets the retry policy's non-zero fields; the others keep
// what earlier options or the defaults gave them.
func WithRetryPolicy(p RetryPolicy) Option {
	return func(c *config) {
		if p.MaxAttempts > 0 {
			c.policy.MaxAttempts = p.MaxAttempts
		}
		if p.Initial > 0 {
			c.policy.Initial = p.Initial
		}
		if p.Max > 0 {
			c.policy.Max = p.Max
		}
		if p.MaxElapsed > 0 {
			c.policy.MaxElapsed = p.MaxElapsed
		}
		if p.RetryAfterCap > 0 {
			c.policy.RetryAfterCap = p.RetryAfterCap
		}
		if p.NoJitter {
			c.policy.NoJitter = true
		}
	}
}

// WithMaxAttempts sets how many requests (not retries) an operation gets
// per call, the first included. The default is 4.
func WithMaxAttempts(n int) Option { return func(c *config) { c.policy.MaxAttempts = n } }

// WithBackoff sets the first backoff bound and the cap on any bound. The
// defaults are 100ms and 5s.
func WithBackoff(initial, max time.Duration) Option {
	return func(c *config) { c.policy.Initial, c.policy.Max = initial, max }
}

// WithKeyHeader sets the name of the key header, for providers that use
// another one (PayPal-Request-Id, Cko-Idempotency-Key, ...).
func WithKeyHeader(name string) Option {
	return func(c *config) {
		if name != "" {
			c.header = http.CanonicalHeaderKey(name)
			c.headerSet = true
		}
	}
}

// WithKeyedMethods sets the methods whose requests get a key and are
// journaled. The default is POST and PATCH.
func WithKeyedMethods(methods ...string) Option {
	return func(c *config) {
		c.keyed = make(map[string]bool, len(methods))
		for _, m := range methods {
			c.keyed[strings.ToUpper(m)] = true
		}
	}
}

// WithMaxBodyBytes sets the largest request body that is journaled. A keyed
// request with a larger body fails with ErrBodyTooLarge before anything is
// sent, unless WithUnjournaledLargeBodies is set. The default is 1 MiB.
func WithMaxBodyBytes(n int64) Option {
	return func(c *config) {
		if n > 0 {
			c.maxBody = n
		}
	}
}

// WithUnjournaledLargeBodies lets a keyed request whose body exceeds the
// body limit go out if its GetBody can produce the body again: its key,
// name and fingerprint are journaled as for any request, so a name keeps
// its key and a key never carries two payloads, but the body is not, so
// Resume cannot send it again after a crash (it reports it instead). A
// request without GetBody still fails with ErrBodyTooLarge. GetBody must
// return the same bytes every time: every attempt's body is hashed as it
// streams, and one whose bytes differ from the fingerprinted ones is cut
// before its last bytes and stops the call with ErrBodyChanged (the
// operation stays in doubt); no attempt follows it.
func WithUnjournaledLargeBodies() Option { return func(c *config) { c.sendLarge = true } }

// WithResendWindow sets how long after its creation an operation may still
// be sent again, by Resume or a re-drive. Keep it below the server's key
// retention. The default is 23 hours.
func WithResendWindow(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.resendWindow = d
		}
	}
}

// WithResendMatchWindow sets how long after a call ended without a
// definite answer its caller received (in doubt, with a 5xx, 429 or 409,
// or finished by Resume) a call with no key of its own that is the same
// call (same method, URL, body, non-volatile headers and principal; see
// WithVolatileHeaders and WithPrincipal) reuses its key: the resend of an
// SDK's retry loop. Matching joins the resends of one call within one
// process only; a double tap (a second call while the first is in flight
// or after its answer) and a retry on another replica are new calls, which
// only a key the application supplies (WithOperation, the server side's
// keys) joins. A backend whose provider calls do not identify the end user
// must name its operations, set WithPrincipal, or turn matching off. Zero
// or less turns matching off. The default is one minute.
func WithResendMatchWindow(d time.Duration) Option {
	return func(c *config) { c.matchWindow = d }
}

// WithResendMatchLimit bounds how many calls without a definite answer
// the resend match index holds in memory, each about 240 bytes. Inside the
// match window it forgets none until it holds n; beyond that the oldest
// is forgotten first (its resend then gets a new key), counted in
// Client.ResendMatchStats and logged once at Warn. Set it above the
// number of calls that may end in doubt within one window during an
// outage. Zero or less keeps the default, 100,000 (about 24 MB when full).
func WithResendMatchLimit(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.matchLimit = n
		}
	}
}

// WithVolatileHeaders adds headers that may differ between the resends of
// one call without making it another call, for resend matching. Every
// other header is part of what identifies a call, so that two calls that
// differ in a tenant or account header (Stripe-Account,
// OpenAI-Organization, OpenAI-Project, ...) are never matched. The
// default list is the per-attempt headers of common clients and tracers:
// retry counters and attempt marks (X-Stainless-Retry-Count, X-Retry-Count,
// X-Retry-Attempt, Amz-Sdk-Request, Amz-Sdk-Invocation-Id,
// X-Goog-Api-Client, X-Stainless-Timeout, X-Stripe-Client-Telemetry),
// trace context (Traceparent, Tracestate, Baggage, the B3, Datadog, X-Ray,
// Cloud Trace, Jaeger and Sentry headers), dates (Date, X-Amz-Date),
// request ids (X-Request-Id, Request-Id, X-Correlation-Id), User-Agent, and
// the hop-by-hop and framing headers. Add a header a client sets afresh on
// each attempt (a request signature's nonce or timestamp); never add one
// that names a tenant. The list's reasons are in the source (match.go).
func WithVolatileHeaders(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			c.volatile[http.CanonicalHeaderKey(n)] = true
		}
	}
}

// WithPrincipal sets a function that names the principal a call acts for
// (an end user, a tenant, an account), for resend matching: calls are
// matched only if it returns the same name for both, and the name is used
// instead of the digest of the call's credentials. Set it when credentials
// change on every request (a JWT signed per request with its own iat or
// jti, request signatures), which otherwise never match, or when one
// provider key serves many end users whose identical calls must never be
// merged (the function then names the end user, for example from the
// request's context). The name replaces the credentials entirely, so it
// must tell apart whatever the credentials would (the provider account as
// well as the end user). An empty name falls back to the credentials'
// digest.
// It is called once per keyed request, from many goroutines at once.
func WithPrincipal(fn func(*http.Request) string) Option {
	return func(c *config) { c.principal = fn }
}

// WithRetention sets how long finished operations are kept in the journal
// to refuse reused keys and map names to keys. It is never shorter than
// the resend window plus an hour. The default is 25 hours.
func WithRetention(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.retention = d
		}
	}
}

// WithOwner names this process in the journal's leases: a store shared by
// several replicas uses it to tell whose operations are whose. The default
// is the host name, the process id and a random suffix.
func WithOwner(name string) Option { return func(c *config) { c.owner = name } }

// WithLease sets how long an operation stays claimed by the process that
// sends it: a live call renews its lease every half lease, and another
// replica's Resume takes an operation only once its lease lapsed. The
// default is 30 seconds.
func WithLease(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.lease = d
		}
	}
}

// WithResumePrepare sets a hook that prepares each resumed request before
// it is sent, typically to add the credentials that were not journaled.
// Without it, an operation whose credentials were removed is not sent: it
// stays pending and Resume reports ErrNoCredentials for it. If the hook
// returns an error the operation stays pending and Resume reports the
// error for it. Resume calls it from several goroutines at once.
func WithResumePrepare(fn func(*http.Request) error) Option {
	return func(c *config) { c.prepare = fn }
}

// WithResumeConcurrency sets how many operations Resume sends at once. The
// default is 8.
func WithResumeConcurrency(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.resumeWorkers = n
		}
	}
}

// WithBackgroundResume starts a goroutine that, every interval, resumes the
// operations pending for at least that long and passes each outcome to fn
// (nil: log it and close the body). Close stops it.
func WithBackgroundResume(every time.Duration, fn func(op Operation, resp *http.Response, err error)) Option {
	return func(c *config) { c.resumeEvery, c.resumeFn = every, fn }
}

// WithRetryBudget bounds retries per host: every request adds ratio tokens
// to the host's bucket, up to burst, and every retry takes one; with no
// token left the call stops retrying (ErrRetryBudget, or the last response
// as it is). With ratio 0.2, retries add at most about 20% to the request
// rate during an outage instead of multiplying it. The default is no budget.
func WithRetryBudget(ratio float64, burst int) Option {
	return func(c *config) {
		if ratio > 0 && burst > 0 {
			c.budget = newRetryBudget(ratio, burst)
		}
	}
}
