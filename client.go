package idem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"sync"
	"time"

	"github.com/idemgo/idem/internal/wait"
)

// Client bundles a journal (KeyStore) and the Transport that uses it.
// Create one with Open (the embedded bbolt journal) or New (any KeyStore),
// give its HTTPClient, or its Transport, to your code or SDK, call Resume
// after a restart, and Close it when done.
//
// A Client is safe for concurrent use. Resume calls are serialized.
type Client struct {
	t    *Transport
	http *http.Client

	resuming chan struct{} // holds a token while a Resume runs
	// resumeMu guards resumeDone, which is closed when the Resume holding
	// the token returns: what Shutdown waits for.
	resumeMu   sync.Mutex
	resumeDone chan struct{}
	// closing is cancelled, with cause ErrClosed, when Shutdown begins:
	// the one signal that stops new Resumes, a running Resume and the
	// background resumer.
	closing     context.Context
	stopClosing context.CancelCauseFunc
	// resumerDone is closed when the background resumer has returned.
	resumerDone chan struct{}

	closeOnce sync.Once
	closeErr  error
}

// Open opens (or creates, mode 0600) the bbolt journal at path and returns a
// Client that uses it. It fails with an error matching ErrJournalLocked if
// another process or handle holds the journal, ErrJournalCorrupt if the
// file is not a readable journal, ErrRecordVersion if a newer idem wrote
// it, and ErrJournalWrite if it cannot be opened or created. Use
// OpenBoltStore and New to set the journal's own options.
func Open(path string, opts ...Option) (*Client, error) {
	cfg := newConfig(opts)
	bo := &BoltOptions{Logger: cfg.logger}
	bo.OnCommit = cfg.hooks.commitHook()
	store, err := OpenBoltStore(path, bo)
	if err != nil {
		return nil, err
	}
	c := newClient(store, cfg)
	if err := c.t.j.refused; err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("open journal %s: %w", path, err)
	}
	return c, nil
}

// New returns a Client that journals to store. The Client owns store from
// now on: Close closes it. New panics if store is nil (or a nil pointer),
// which is what a store constructor's error left unchecked gives: check
// the error of OpenBoltStore, pgstore.Open and the like first.
//
// If store is a PolicyStore, New checks the Client's policy (key header,
// resend window, retention, match window) against the journal's and
// stores it. When the journal's policy does not allow it (see
// Policy.Allows), the Client is refused: every keyed call and Resume fails
// with an error matching ErrPolicyConflict, and nothing is sent. Open
// returns that error instead. A store that cannot read or write its
// policy is only logged (Warn): its Reserve would fail too if the journal
// were unusable.
func New(store KeyStore, opts ...Option) *Client {
	if store == nil || isNilPointer(store) {
		panic(fmt.Sprintf("idem.New: the KeyStore is nil (%T): check the error of the call that opened it (OpenBoltStore, pgstore.Open, ...) before calling New", store))
	}
	return newClient(store, newConfig(opts))
}

// isNilPointer reports whether v is a nil pointer in a non-nil interface.
func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

func newClient(store KeyStore, cfg config) *Client {
	j := &journal{
		store: store, owner: cfg.owner, lease: cfg.lease, resendWindow: cfg.resendWindow,
		retention: cfg.retention, log: cfg.logger,
		recent: recentCalls{window: cfg.matchWindow, limit: cfg.matchLimit, log: cfg.logger},
	}
	j.keyHeader, j.headerNamed = cfg.header, cfg.headerSet
	t := &Transport{cfg: cfg, j: j}
	j.newKey = t.cfg.newKey
	c := &Client{t: t, resuming: make(chan struct{}, 1)}
	c.closing, c.stopClosing = context.WithCancelCause(context.Background())
	c.http = &http.Client{Transport: t, CheckRedirect: t.checkRedirect}
	j.anchorClock()
	if err := j.adoptPolicy(cfg.journalPolicy()); errors.Is(err, ErrPolicyConflict) {
		j.refused = err
	} else if err != nil {
		cfg.logger.Warn("idem: journal policy", "exception.message", err)
	}
	if j.refused != nil {
		return c // it sweeps nothing and resumes nothing
	}
	j.maybeSweep() // the first sweep runs at once, in the background
	if cfg.resumeEvery > 0 {
		c.resumerDone = make(chan struct{})
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
// decide on. A 303 (or 301, 302) after a POST is followed with a GET,
// without the secret headers if it goes to another host (see Transport).
// Its CloseIdleConnections reaches the base transport.
func (c *Client) HTTPClient() *http.Client { return c.http }

// Transport returns the Client's http.RoundTripper, for SDKs that take a
// transport rather than a client.
func (c *Client) Transport() *Transport { return c.t }

// Pending returns up to limit pending operations with keys after after
// ("" starts at the first), in key order, without their requests: those
// in flight and those in doubt. It changes nothing, so a status page or a
// metric may call it.
func (c *Client) Pending(ctx context.Context, after string, limit int) ([]Operation, error) {
	ops, err := c.t.j.store.Pending(ctx, after, limit)
	for i := range ops {
		ops[i].Header, ops[i].Body = nil, nil
	}
	return ops, err
}

// closeWait bounds how long Close waits: for calls in flight, for the
// background resumer and a running Resume, for the journal's close.
const closeWait = 30 * time.Second

// Close is Shutdown with a bound of 30 seconds (and the second Shutdown
// keeps for the journal's close).
func (c *Client) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	return c.Shutdown(ctx)
}

// Shutdown closes the Client gracefully, as http.Server.Shutdown does: new
// calls and Resumes fail at once with ErrClosed, and a Resume that runs
// (the background resumer's too) is cancelled (what it was sending stays
// pending); calls in flight run to their end (a call ends when its caller
// has read its response body to the end or closed it, or got an error),
// so their outcomes are recorded; then every change is made durable and
// the journal is closed. Every one of these waits ends when ctx does:
// then Shutdown goes on with the next, closes the journal anyway (the
// calls still in flight stay pending in it, and Resume finishes them
// after the restart), and returns an error that names each thing it
// stopped waiting for and matches ctx's cause, such as
// context.DeadlineExceeded. The sweeps and the journal's close still get
// a second once ctx has ended, so Shutdown returns at most a second after
// ctx ends. A Resume handler or a WithResumePrepare hook
// that does not return never holds Shutdown past ctx; it goes on in the
// background, against a closed journal. Later calls return the first
// call's result.
func (c *Client) Shutdown(ctx context.Context) error {
	c.closeOnce.Do(func() { c.closeErr = c.shutdown(ctx) })
	return c.closeErr
}

func (c *Client) shutdown(ctx context.Context) error {
	j := c.t.j
	c.stopClosing(ErrClosed)
	idle, _ := j.calls.close()
	var errs []error
	note := func(err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("idem: shutdown: %w", err))
		}
	}
	if c.resumerDone != nil {
		note(wait.For(ctx, "the background resumer", c.resumerDone))
	}
	if err := wait.For(ctx, "calls in flight", idle); err != nil {
		if n := j.calls.count(); n > 0 {
			note(fmt.Errorf("%d calls still in flight stay pending: %w", n, err))
		}
	}
	j.stopRenewal()
	// No Resume starts once closing is cancelled (see resume): wait for
	// the one that may run.
	c.resumeMu.Lock()
	running := c.resumeDone
	c.resumeMu.Unlock()
	if running != nil {
		note(wait.For(ctx, "a running Resume", running))
	}
	// The last waits are for idem's own work, which is short unless a
	// dependency is stuck: they get closeGrace when ctx has ended.
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), closeGrace)
		defer cancel()
	}
	j.closeBackground()
	note(wait.For(ctx, "a sweep of finished operations", wait.Group(&j.sweeps)))
	err := wait.Do(ctx, "the journal to close", func(context.Context) error { return j.store.Close() })
	var gaveUp *wait.Error
	if errors.As(err, &gaveUp) {
		note(err)
	} else if err != nil {
		errs = append(errs, err) // the journal's own error, as it says it
	}
	return errors.Join(errs...)
}

// closeGrace is how long Shutdown still waits for its sweeps and the
// journal's Close when ctx has ended already, so that a Shutdown that
// gave up on a call in flight still closes a healthy journal: Shutdown
// returns at most closeGrace after ctx ends.
const closeGrace = time.Second

// ready reports whether ch is closed.
func ready(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
