package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Client bundles a journal (KeyStore) and the Transport that uses it.
// Create one with Open (the embedded bbolt journal) or New (any KeyStore),
// give its HTTPClient, or its Transport, to your code or SDK, call Resume
// after a restart, and Close it when done.
type Client struct {
	store     KeyStore
	transport *Transport
	http      *http.Client

	resumeMu sync.Mutex // one Resume at a time

	stop chan struct{} // closed by Close to stop the background resumer
	done chan struct{} // closed when the background resumer has returned
	once sync.Once
}

// Open opens (or creates, mode 0600) the bbolt journal at path and returns a
// Client that uses it. It fails with an error matching ErrJournalLocked if
// another process or handle holds the journal, and ErrJournalCorrupt if the
// file is not a readable journal.
func Open(path string, opts ...Option) (*Client, error) {
	cfg := newConfig(opts)
	store, err := OpenBoltStore(path, &BoltOptions{
		LockTimeout: cfg.lockTimeout,
		Logger:      cfg.logger,
	})
	if err != nil {
		return nil, err
	}
	return newClient(store, cfg), nil
}

// New returns a Client that journals to store. The Client owns store from
// now on: Close closes it.
func New(store KeyStore, opts ...Option) *Client {
	return newClient(store, newConfig(opts))
}

func newClient(store KeyStore, cfg config) *Client {
	t := &Transport{store: store, cfg: cfg}
	t.init()
	c := &Client{store: store, transport: t, http: &http.Client{Transport: t, CheckRedirect: t.checkRedirect}}
	if cfg.resumeEvery > 0 {
		c.stop, c.done = make(chan struct{}), make(chan struct{})
		go c.resumeLoop()
	}
	return c
}

// HTTPClient returns an *http.Client whose Transport is the Client's
// Transport. It has no timeout, like the zero http.Client; set a deadline on
// each request's context instead. It follows redirects like the zero
// http.Client, except one that would re-send a keyed request (a 307 or 308
// answer to a POST): that response is returned to the caller, because
// sending the payload to another URL is a new operation the caller must
// decide on. A 303 (or 301, 302) after a POST is followed with a GET.
func (c *Client) HTTPClient() *http.Client { return c.http }

// Transport returns the Client's http.RoundTripper, for SDKs that take a
// transport rather than a client.
func (c *Client) Transport() *Transport { return c.transport }

// Close stops the background resumer, if any, and closes the journal,
// making every change durable. Operations still pending stay in the
// journal for the next Resume.
func (c *Client) Close() error {
	c.once.Do(func() {
		if c.stop != nil {
			close(c.stop)
			<-c.done
		}
	})
	return c.store.Close()
}

// Resume finishes the operations pending in the journal: those whose
// outcome the caller never learned because the process died, or because
// the last attempt ended without a response. It walks them oldest first
// and, for each, re-sends the journaled request with its original key
// through the retry policy and calls fn once with the final response (the
// body is readable; fn must close it) or the error.
//
// An operation older than the resend window is not sent: it is marked
// expired and fn receives an error matching ErrExpired, so the application
// can reconcile it with the server. An operation that is in flight in this
// process (a live call, or another Resume) is skipped; its caller owns its
// outcome. Credentials are not in the journal: use WithResumePrepare to add
// them back.
//
// If fn panics, the operation is made pending again, so that the next
// Resume delivers its outcome once more (the server replays it), and Resume
// goes on with the others; it then returns an error naming the operations
// whose handler panicked. Resume returns early with ctx's error when ctx
// ends, and with the journal's error if it cannot be read.
func (c *Client) Resume(ctx context.Context, fn func(op Operation, resp *http.Response, err error)) error {
	return c.resume(ctx, 0, fn)
}

// resumePage is how many pending operations Resume reads at a time.
const resumePage = 256

// resume is Resume for operations last updated at least minAge ago.
func (c *Client) resume(ctx context.Context, minAge time.Duration, fn func(Operation, *http.Response, error)) error {
	c.resumeMu.Lock()
	defer c.resumeMu.Unlock()
	if fn == nil {
		fn = c.logOutcome
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		panics []error
		sem    = make(chan struct{}, c.transport.cfg.resumeWorkers)
		after  string
		cutoff = time.Now().Add(-minAge)
	)
	defer wg.Wait()
	for {
		mark := c.transport.flight.mark()
		now := time.Now()
		page, err := c.store.Claim(ctx, Lease{Owner: c.transport.cfg.owner, At: now, Until: now.Add(c.transport.cfg.lease)}, after, resumePage)
		if err != nil {
			return fmt.Errorf("idem: resume: reading pending operations: %w", err)
		}
		if len(page) == 0 {
			break
		}
		after = page[len(page)-1].Key
		for _, op := range page {
			if op.Updated.After(cutoff) {
				continue
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := c.resumeOne(ctx, op, mark, fn); err != nil {
					mu.Lock()
					panics = append(panics, err)
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return errors.Join(panics...)
}

// resumeOne finishes one pending operation, read from the journal after
// mark. It returns an error only when fn panicked.
func (c *Client) resumeOne(ctx context.Context, op Operation, mark quietMark, fn func(Operation, *http.Response, error)) error {
	t := c.transport
	ids := flightIDs(&op)
	if !t.flight.acquire(false, ids) {
		return nil // in flight here; its caller gets the outcome
	}
	defer t.flight.release(false, ids)
	rec := op
	if !t.flight.quietSince(mark) {
		// A live call may have finished it since the page was read.
		var err error
		if rec, err = c.store.Get(ctx, op.Key); err != nil || rec.State != StatePending {
			return nil
		}
	}
	failed := func(state State, cause, err error) {
		if state.Finished() {
			if ferr := c.store.Finish(ctx, rec.Key, Outcome{State: state, Err: cause.Error()}); ferr != nil {
				err = errors.Join(err, ferr)
			}
		}
		rec.State = state
		fn(rec, nil, &Error{Key: rec.Key, Name: rec.Name, State: state, LastStatus: rec.LastStatus, Cause: cause, Err: err})
	}
	if time.Since(rec.Created) >= c.transport.cfg.resendWindow {
		failed(StateExpired, ErrExpired, nil)
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, rec.Method, rec.URL, nil)
	if err != nil {
		failed(StateFailed, ErrNotRetryable, err)
		return nil
	}
	req.Header = rec.Header.Clone()
	if req.Header == nil {
		req.Header = make(http.Header)
	}
	req.Header.Set(c.transport.cfg.header, rec.Key)
	if c.transport.cfg.prepare != nil {
		if err := c.transport.cfg.prepare(req); err != nil {
			failed(StatePending, fmt.Errorf("idem: resume prepare hook: %w", err), nil)
			return nil
		}
	}
	resp, err := t.send(ctx, &rec, req)
	return c.deliver(rec, resp, err, fn)
}

// deliver calls fn with an operation's outcome. If fn panics it closes the
// response, makes the operation pending again, and returns the panic as an
// error.
func (c *Client) deliver(rec Operation, resp *http.Response, err error, fn func(Operation, *http.Response, error)) (perr error) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if resp != nil {
			resp.Body.Close()
		}
		perr = fmt.Errorf("idem: resume handler panicked for operation %s: %v", rec.Key, r)
		now := time.Now()
		l := Lease{Owner: c.transport.cfg.owner, At: now, Until: now.Add(c.transport.cfg.lease)}
		if _, rerr := c.store.Acquire(context.Background(), rec.Key, l, rec.Header, rec.Body); rerr != nil {
			perr = errors.Join(perr, rerr)
		}
	}()
	if resp != nil {
		// The transport returns a response only as the final outcome: 2xx and
		// 3xx are success, anything else failed (see Transport.finish).
		rec.State, rec.LastStatus = StateSucceeded, resp.StatusCode
		if resp.StatusCode >= 400 {
			rec.State = StateFailed
		}
	} else {
		var ie *Error
		if errors.As(err, &ie) {
			rec.State = ie.State
		}
	}
	fn(rec, resp, err)
	return nil
}

// logOutcome is the handler of a background Resume without one: it logs
// the outcome and closes the body.
func (c *Client) logOutcome(op Operation, resp *http.Response, err error) {
	if resp != nil {
		resp.Body.Close()
		c.transport.cfg.logger.Info("idem: resumed operation", "key", op.Key, "name", op.Name, "status", resp.StatusCode)
		return
	}
	c.transport.cfg.logger.Warn("idem: resumed operation failed", "key", op.Key, "name", op.Name, "err", err)
}

// resumeLoop is the background resumer: every interval it resumes the
// operations that have been pending for at least that long.
func (c *Client) resumeLoop() {
	defer close(c.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	tick := time.NewTicker(c.transport.cfg.resumeEvery)
	defer tick.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
			if err := c.resume(ctx, c.transport.cfg.resumeEvery, c.transport.cfg.resumeFn); err != nil && ctx.Err() == nil {
				c.transport.cfg.logger.Warn("idem: background resume", "err", err)
			}
		}
	}
}

// Context keys.
type (
	keyContext       struct{}
	operationContext struct{}
	noKeyContext     struct{}
)

// WithKey returns a context whose keyed requests use key as their
// idempotency key. It outranks every other source of a key. A key must be 1
// to 255 bytes of visible ASCII. Use it to retry an operation whose key an
// *Error reported.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContext{}, key)
}

// WithOperation returns a context whose keyed requests belong to the
// durable operation name (for example "pay:order-42"). The first request
// with a name creates and journals a random key for it; every later one,
// in this process or after a restart, gets the same key, so re-driving a
// business action never performs it twice. A finished operation re-driven
// within the resend window is sent again with its key (the server replays
// its answer); beyond the window it is refused with an error matching
// ErrExpired that carries the recorded outcome.
func WithOperation(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, operationContext{}, name)
}

// WithoutKey returns a context whose requests carry no idempotency key and
// are not journaled. A non-idempotent request sent this way is retried only
// when the failure proves it never reached the server.
func WithoutKey(ctx context.Context) context.Context {
	return context.WithValue(ctx, noKeyContext{}, true)
}

func withoutKey(ctx context.Context) bool {
	v, _ := ctx.Value(noKeyContext{}).(bool)
	return v
}

// Option configures a Client.
type Option func(*config)

// config is what Options set. newConfig fills in the defaults.
type config struct {
	logger        *slog.Logger
	base          http.RoundTripper
	policy        RetryPolicy
	header        string
	keyed         map[string]bool
	secret        map[string]bool
	maxBody       int64
	sendLarge     bool
	resendWindow  time.Duration
	retention     time.Duration
	lockTimeout   time.Duration
	prepare       func(*http.Request) error
	resumeWorkers int
	resumeEvery   time.Duration
	resumeFn      func(Operation, *http.Response, error)
	budget        *retryBudget
	owner         string
	lease         time.Duration
}

// Defaults of the options.
const (
	// DefaultHeader is the request header that carries the key.
	DefaultHeader = "Idempotency-Key"
	// DefaultMaxBodySize is the largest request body that is journaled.
	DefaultMaxBodySize = 1 << 20
	// DefaultResendWindow is how long after its first attempt an operation
	// may be sent again: below the 24 h that Stripe and Checkout.com keep keys.
	DefaultResendWindow = 23 * time.Hour
	// DefaultRetention is how long finished operations stay in the journal.
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultLease is how long an operation stays claimed by the process
	// sending it without a renewal.
	DefaultLease = 30 * time.Second
)

func newConfig(opts []Option) config {
	c := config{
		base:          http.DefaultTransport,
		header:        DefaultHeader,
		keyed:         map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		secret:        map[string]bool{"Authorization": true, "Cookie": true, "Proxy-Authorization": true},
		maxBody:       DefaultMaxBodySize,
		resendWindow:  DefaultResendWindow,
		retention:     DefaultRetention,
		resumeWorkers: 8,
		lease:         DefaultLease,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	if c.base == nil {
		c.base = http.DefaultTransport
	}
	c.policy = c.policy.withDefaults()
	c.owner = uuid.NewString()
	return c
}

// WithLogger sets the logger for retries and background work. Nil, the
// default, is silent. idem logs each retry at Debug and never logs an
// error that it also returns.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithBaseTransport sets the RoundTripper that sends each attempt. The
// default is http.DefaultTransport.
func WithBaseTransport(rt http.RoundTripper) Option { return func(c *config) { c.base = rt } }

// WithRetryPolicy sets the whole retry policy; zero fields take defaults.
func WithRetryPolicy(p RetryPolicy) Option { return func(c *config) { c.policy = p } }

// WithMaxAttempts sets how many attempts (not retries) an operation gets
// per call, the first included. The default is 4.
func WithMaxAttempts(n int) Option { return func(c *config) { c.policy.MaxAttempts = n } }

// WithBackoff sets the first backoff bound and the cap on any bound. The
// defaults are 100ms and 5s.
func WithBackoff(initial, max time.Duration) Option {
	return func(c *config) { c.policy.Initial, c.policy.Max = initial, max }
}

// WithHeader sets the name of the key header, for providers that use
// another one (PayPal-Request-Id, Cko-Idempotency-Key, ...).
func WithHeader(name string) Option {
	return func(c *config) {
		if name != "" {
			c.header = http.CanonicalHeaderKey(name)
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

// WithSecretHeaders adds headers that are never written to the journal,
// besides Authorization, Cookie and Proxy-Authorization. Use
// WithResumePrepare to add them back to resumed requests.
func WithSecretHeaders(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			c.secret[http.CanonicalHeaderKey(n)] = true
		}
	}
}

// WithMaxBodySize sets the largest request body that is journaled. A keyed
// request with a larger body fails with ErrBodyTooLarge before anything is
// sent. The default is 1 MiB.
func WithMaxBodySize(n int64) Option {
	return func(c *config) {
		if n > 0 {
			c.maxBody = n
		}
	}
}

// WithUnjournaledLargeBodies makes a keyed request whose body exceeds the
// body limit go out with its key but WITHOUT being journaled: it survives
// no crash, and it is retried only if its GetBody can rewind the body.
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

// WithRetention sets how long finished operations are kept in the journal
// to detect key reuse and map names to keys. The default is 7 days.
func WithRetention(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.retention = d
		}
	}
}

// WithLockTimeout sets how long Open waits for a journal that another
// process holds before failing with ErrJournalLocked. The default is 2s.
func WithLockTimeout(d time.Duration) Option { return func(c *config) { c.lockTimeout = d } }

// WithResumePrepare sets a hook that prepares each resumed request before
// it is sent, typically to add the credentials that were not journaled. If
// it returns an error the operation stays pending and Resume reports the
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
