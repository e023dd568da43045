package idem_test

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// step is one scripted answer of a scriptRT: a response, or an error.
type step struct {
	status int
	header http.Header
	body   string
	err    error
}

// sentReq is what a scriptRT saw of one attempt.
type sentReq struct {
	method, url, key string
	header           http.Header
	body             string
	at               time.Time
}

// trackedBody is a response body that records whether it was closed.
type trackedBody struct {
	io.Reader
	closed bool
}

func (b *trackedBody) Close() error { b.closed = true; return nil }

// scriptRT is a fake RoundTripper that answers from a script; after the
// script it repeats the last step.
type scriptRT struct {
	mu     sync.Mutex
	steps  []step
	sent   []sentReq
	bodies []*trackedBody
	resps  []*http.Response
}

func (s *scriptRT) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body.Close()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, sentReq{method: r.Method, url: r.URL.String(), key: r.Header.Get("Idempotency-Key"), header: r.Header.Clone(), body: string(body), at: time.Now()})
	st := s.steps[min(len(s.sent), len(s.steps))-1]
	if st.err != nil {
		return nil, st.err
	}
	b := &trackedBody{Reader: strings.NewReader(st.body)}
	s.bodies = append(s.bodies, b)
	h := st.header.Clone()
	if h == nil {
		h = http.Header{}
	}
	resp := &http.Response{StatusCode: st.status, Header: h, Body: b, Request: r}
	s.resps = append(s.resps, resp)
	return resp, nil
}

// keys returns the key sent with each attempt.
func (s *scriptRT) keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, len(s.sent))
	for i, r := range s.sent {
		out[i] = r.key
	}
	return out
}

// discardedClosed checks that every response body except the returned
// one was closed.
func (s *scriptRT) discardedClosed(t *testing.T, returned *http.Response) {
	t.Helper()
	for i, r := range s.resps {
		if r == returned {
			continue
		}
		assert.Truef(t, s.bodies[i].closed, "body of discarded response %d (status %d) not closed", i, r.StatusCode)
	}
}

func resp(status int, kv ...string) step {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return step{status: status, header: h, body: http.StatusText(status)}
}

func fail(err error) step { return step{err: err} }

var (
	errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	errReset   = &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	errTimeout = &net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}
)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// newTestClient returns a Client over a MemoryStore and rt, with retries
// that wait whole seconds so synctest's fake clock shows them.
func newTestClient(rt http.RoundTripper, opts ...idem.Option) (*idem.Client, *idem.MemoryStore) {
	store := idem.NewMemoryStore()
	opts = append([]idem.Option{idem.WithBaseTransport(rt), idem.WithBackoff(time.Second, 8*time.Second)}, opts...)
	return idem.New(store, opts...), store
}

func post(t *testing.T, ctx context.Context, c *http.Client, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://pay.example/v1/charges", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	return c.Do(req)
}

// TestWireTable runs the cases of docs/DESIGN.md's wire table, at least
// one per row: each row of that table names the cases here that check it.
func TestWireTable(t *testing.T) {
	tests := []struct {
		name      string
		steps     []step
		attempts  int        // attempts the server sees
		status    int        // status returned to the caller, 0 for an error
		wantErr   error      // error the caller gets
		state     idem.State // journal state afterwards
		minWaited time.Duration
	}{
		{"connection refused", []step{fail(errRefused), resp(201)}, 2, 201, nil, idem.StateSucceeded, 0},
		{"connection reset", []step{fail(errReset), resp(201)}, 2, 201, nil, idem.StateSucceeded, 0},
		{"timeout", []step{fail(errTimeout), resp(201)}, 2, 201, nil, idem.StateSucceeded, 0},
		{"EOF", []step{fail(io.EOF), fail(io.ErrUnexpectedEOF), resp(201)}, 3, 201, nil, idem.StateSucceeded, 0},
		{"200", []step{resp(200)}, 1, 200, nil, idem.StateSucceeded, 0},
		{"201 replayed", []step{resp(201, "Idempotent-Replayed", "true")}, 1, 201, nil, idem.StateSucceeded, 0},
		{"302", []step{resp(302)}, 1, 302, nil, idem.StateSucceeded, 0},
		{"409 in progress", []step{resp(409, "Retry-After", "3"), resp(200)}, 2, 200, nil, idem.StateSucceeded, 3 * time.Second},
		{"409 key already used", []step{{status: 409, body: `{"type":"https://x/problems/idempotency_key_already_used"}`}}, 1, 409, nil, idem.StateFailed, 0},
		{"409 performed, answer not kept", []step{{status: 409, body: `{"type":"https://x/problems#already-used-response-not-kept","original_status":201}`}, resp(200)}, 1, 409, nil, idem.StateSucceeded, 0},
		{"422", []step{resp(422), resp(200)}, 1, 422, nil, idem.StateFailed, 0},
		{"400", []step{resp(400), resp(200)}, 1, 400, nil, idem.StateFailed, 0},
		{"401", []step{resp(401), resp(200)}, 1, 401, nil, idem.StateFailed, 0},
		{"403", []step{resp(403), resp(200)}, 1, 403, nil, idem.StateFailed, 0},
		{"404", []step{resp(404), resp(200)}, 1, 404, nil, idem.StateFailed, 0},
		{"408", []step{resp(408), resp(200)}, 2, 200, nil, idem.StateSucceeded, 0},
		{"425", []step{resp(425), resp(200)}, 2, 200, nil, idem.StateSucceeded, 0},
		{"429 with Retry-After", []step{resp(429, "Retry-After", "7"), resp(200)}, 2, 200, nil, idem.StateSucceeded, 7 * time.Second},
		{"500", []step{resp(500), resp(200)}, 2, 200, nil, idem.StateSucceeded, 0},
		{"502", []step{resp(502), resp(200)}, 2, 200, nil, idem.StateSucceeded, 0},
		{"503", []step{resp(503), resp(200)}, 2, 200, nil, idem.StateSucceeded, 0},
		{"504", []step{resp(504), resp(200)}, 2, 200, nil, idem.StateSucceeded, 0},
		{"529", []step{resp(529), resp(200)}, 2, 200, nil, idem.StateSucceeded, 0},
		{"503 until attempts run out", []step{resp(503)}, 4, 503, nil, idem.StateFailed, 0},
		{"501", []step{resp(501), resp(200)}, 1, 501, nil, idem.StateFailed, 0},
		{"505", []step{resp(505), resp(200)}, 1, 505, nil, idem.StateFailed, 0},
		{"TLS verification", []step{fail(&wrappedErr{x509.UnknownAuthorityError{}}), resp(200)}, 1, 0, idem.ErrNotRetryable, idem.StateFailed, 0},
		{"Stripe-Should-Retry: true on a 400", []step{resp(400, "Stripe-Should-Retry", "true"), resp(200)}, 2, 200, nil, idem.StateSucceeded, 0},
		{"X-Should-Retry: false on a 503", []step{resp(503, "X-Should-Retry", "false"), resp(200)}, 1, 503, nil, idem.StateFailed, 0},
		{"network error until attempts run out", []step{fail(errReset)}, 4, 0, idem.ErrAttemptsExhausted, idem.StatePending, 0},
		{"refused until attempts run out", []step{fail(errRefused)}, 4, 0, idem.ErrAttemptsExhausted, idem.StateFailed, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := &scriptRT{steps: tt.steps}
				c, store := newTestClient(rt)
				defer c.Close()
				start := time.Now()
				got, err := post(t, context.Background(), c.HTTPClient(), `{"amount":4200}`)
				waited := time.Since(start)

				// Attempts count requests written: a refused connection or a
				// failed TLS handshake writes none.
				written := 0
				for i := range tt.attempts {
					if err := tt.steps[min(i, len(tt.steps)-1)].err; err != errRefused && !errors.As(err, new(*wrappedErr)) {
						written++
					}
				}
				if tt.wantErr != nil {
					require.ErrorIs(t, err, tt.wantErr)
					var ie *idem.Error
					require.ErrorAs(t, err, &ie)
					assert.Equal(t, written, ie.Attempts)
					assert.Equal(t, tt.state, ie.State)
				} else {
					require.NoError(t, err)
					assert.Equal(t, tt.status, got.StatusCode)
					b, err := io.ReadAll(got.Body)
					require.NoError(t, err)
					assert.NotEmpty(t, b, "returned body must be readable")
					got.Body.Close()
				}
				require.Len(t, rt.sent, tt.attempts)
				keys := rt.keys()
				assert.NotEmpty(t, keys[0])
				for i, r := range rt.sent {
					assert.Equal(t, keys[0], r.key, "attempt %d key", i+1)
					assert.Equal(t, `{"amount":4200}`, r.body, "attempt %d body", i+1)
					assert.Equal(t, "application/json", r.header.Get("Content-Type"))
				}
				rt.discardedClosed(t, got)
				assert.GreaterOrEqual(t, waited, tt.minWaited)

				op, err := store.Get(context.Background(), keys[0])
				require.NoError(t, err)
				assert.Equal(t, tt.state, op.State)
				assert.Equal(t, written, op.Attempts)
				if tt.state.Finished() {
					assert.Nil(t, op.Body, "finished operation keeps no body")
				} else {
					assert.Equal(t, `{"amount":4200}`, string(op.Body))
				}
			})
		})
	}
}

// wrappedErr wraps an error in a type of its own, so that the classifier
// is shown to look through wrapping.
type wrappedErr struct{ err error }

func (e *wrappedErr) Error() string { return "wrapped: " + e.err.Error() }
func (e *wrappedErr) Unwrap() error { return e.err }

func TestCallerRequestUnmodified(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{resp(503), resp(200)}}
		c, _ := newTestClient(rt)
		defer c.Close()
		req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", strings.NewReader("x=1"))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer sk_test")
		before := req.Header.Clone()
		r, err := c.Transport().RoundTrip(req)
		require.NoError(t, err)
		r.Body.Close()
		assert.Equal(t, before, req.Header, "caller's headers changed")
		assert.Empty(t, req.Header.Get("Idempotency-Key"))
		assert.Len(t, rt.sent, 2)
		assert.Equal(t, "Bearer sk_test", rt.sent[1].header.Get("Authorization"), "live retries keep credentials")
	})
}

func TestRetryAfter(t *testing.T) {
	tests := []struct {
		name  string
		value func(now time.Time) string
		want  time.Duration // exact wait (NoJitter is off, so only Retry-After makes it exact)
	}{
		{"seconds", func(time.Time) string { return "4" }, 4 * time.Second},
		{"http date", func(now time.Time) string { return now.Add(10 * time.Second).UTC().Format(http.TimeFormat) }, 10 * time.Second},
		{"date in the past", func(now time.Time) string { return now.Add(-time.Hour).UTC().Format(http.TimeFormat) }, 0},
		{"capped", func(time.Time) string { return "86400" }, 30 * time.Second},
		{"overflow capped", func(time.Time) string { return "99999999999999999999999" }, 30 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				now := time.Now()
				rt := &scriptRT{steps: []step{resp(503, "Retry-After", tt.value(now)), resp(200)}}
				c, _ := newTestClient(rt, idem.WithRetryPolicy(idem.RetryPolicy{Initial: time.Hour, Max: time.Hour, MaxElapsed: 10 * time.Hour, RetryAfterCap: 30 * time.Second}))
				defer c.Close()
				r, err := post(t, context.Background(), c.HTTPClient(), "{}")
				require.NoError(t, err)
				r.Body.Close()
				require.Len(t, rt.sent, 2)
				// synctest's clock moves only when every goroutine waits, so the
				// gap is exactly the wait chosen.
				assert.Equal(t, tt.want, rt.sent[1].at.Sub(rt.sent[0].at))
			})
		})
	}
	t.Run("malformed falls back to backoff", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rt := &scriptRT{steps: []step{resp(503, "Retry-After", "soon"), resp(200)}}
			c, _ := newTestClient(rt, idem.WithRetryPolicy(idem.RetryPolicy{Initial: 2 * time.Second, NoJitter: true}))
			defer c.Close()
			r, err := post(t, context.Background(), c.HTTPClient(), "{}")
			require.NoError(t, err)
			r.Body.Close()
			assert.Equal(t, 2*time.Second, rt.sent[1].at.Sub(rt.sent[0].at))
		})
	})
}

func TestBackoffGrowsWithJitterBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{fail(errReset), fail(errReset), fail(errReset), fail(errReset), fail(errReset), resp(200)}}
		c, _ := newTestClient(rt, idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 6, Initial: time.Second, Max: 4 * time.Second}))
		defer c.Close()
		r, err := post(t, context.Background(), c.HTTPClient(), "{}")
		require.NoError(t, err)
		r.Body.Close()
		bounds := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second, 4 * time.Second}
		for i, b := range bounds {
			gap := rt.sent[i+1].at.Sub(rt.sent[i].at)
			assert.LessOrEqual(t, gap, b, "wait %d exceeds its bound", i+1)
			assert.GreaterOrEqual(t, gap, time.Duration(0))
		}
	})
}

func TestDeadlineNeverOutslept(t *testing.T) {
	t.Run("network error", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rt := &scriptRT{steps: []step{fail(errReset), resp(200)}}
			c, store := newTestClient(rt, idem.WithRetryPolicy(idem.RetryPolicy{Initial: 10 * time.Second, NoJitter: true}))
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			_, err := post(t, ctx, c.HTTPClient(), "{}")
			require.ErrorIs(t, err, idem.ErrDeadline)
			assert.Zero(t, time.Since(start), "stopped at once instead of sleeping")
			var ie *idem.Error
			require.ErrorAs(t, err, &ie)
			assert.Equal(t, idem.StatePending, ie.State, "the outcome is unknown")
			op, err := store.Get(context.Background(), ie.Key)
			require.NoError(t, err)
			assert.Equal(t, idem.StatePending, op.State)
		})
	})
	t.Run("Retry-After longer than the deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rt := &scriptRT{steps: []step{resp(429, "Retry-After", "30"), resp(200)}}
			c, _ := newTestClient(rt)
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			r, err := post(t, ctx, c.HTTPClient(), "{}")
			require.NoError(t, err)
			defer r.Body.Close()
			assert.Equal(t, 429, r.StatusCode, "the caller sees the server's answer")
			assert.Zero(t, time.Since(start))
			assert.Len(t, rt.sent, 1)
		})
	})
	t.Run("cancelled during the wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rt := &scriptRT{steps: []step{resp(503, "Retry-After", "20"), resp(200)}}
			c, _ := newTestClient(rt)
			defer c.Close()
			ctx, cancel := context.WithCancelCause(context.Background())
			stopErr := errors.New("user went away")
			time.AfterFunc(5*time.Second, func() { cancel(stopErr) })
			start := time.Now()
			_, err := post(t, ctx, c.HTTPClient(), "{}")
			require.ErrorIs(t, err, stopErr)
			assert.Equal(t, 5*time.Second, time.Since(start))
			var ie *idem.Error
			require.ErrorAs(t, err, &ie)
			assert.Equal(t, 503, ie.LastStatus)
		})
	})
}

func TestIdempotentMethodsRetriedWithoutKey(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete, http.MethodOptions} {
		t.Run(method, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := &scriptRT{steps: []step{fail(errReset), resp(503), resp(200)}}
				c, store := newTestClient(rt)
				defer c.Close()
				req, err := http.NewRequest(method, "https://pay.example/v1/charges/ch_1", strings.NewReader("v"))
				require.NoError(t, err)
				r, err := c.HTTPClient().Do(req)
				require.NoError(t, err)
				r.Body.Close()
				require.Len(t, rt.sent, 3)
				for _, s := range rt.sent {
					assert.Empty(t, s.key)
					assert.Equal(t, "v", s.body)
				}
				pend, err := store.Pending(context.Background(), "", 10)
				require.NoError(t, err)
				assert.Empty(t, pend)
			})
		})
	}
}

func TestUnkeyedPostRetriedOnlyWhenNothingWasSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{fail(errRefused), fail(errReset), resp(200)}}
		c, _ := newTestClient(rt)
		defer c.Close()
		_, err := post(t, idem.WithoutKey(context.Background()), c.HTTPClient(), "{}")
		require.ErrorIs(t, err, syscall.ECONNRESET)
		assert.Len(t, rt.sent, 2, "refused is retried, reset is not")
		assert.Empty(t, rt.sent[0].key)

		rt2 := &scriptRT{steps: []step{resp(503), resp(200)}}
		c2, _ := newTestClient(rt2)
		defer c2.Close()
		r, err := post(t, idem.WithoutKey(context.Background()), c2.HTTPClient(), "{}")
		require.NoError(t, err)
		r.Body.Close()
		assert.Equal(t, 503, r.StatusCode, "a 503 does not prove the request was not performed")
		assert.Len(t, rt2.sent, 1)
	})
}

// TestTwoHeaderKeys: a request whose key header holds two different keys
// (two values, or two spellings of the name) is refused before anything is
// journaled: which one the caller meant is unknown, and a server reading
// the header as a list would refuse it. The first was sent silently.
func TestTwoHeaderKeys(t *testing.T) {
	for name, h := range map[string]http.Header{
		"two values":    {"Idempotency-Key": {"k-one", "k-two"}},
		"two spellings": {"Idempotency-Key": {"k-one"}, "idempotency-key": {"k-two"}},
	} {
		t.Run(name, func(t *testing.T) {
			rt := &scriptRT{steps: []step{resp(201)}}
			c, store := newTestClient(rt)
			defer c.Close()
			req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", strings.NewReader("a"))
			require.NoError(t, err)
			req.Header = h
			r, err := c.HTTPClient().Do(req)
			if r != nil {
				r.Body.Close()
			}
			require.ErrorIs(t, err, idem.ErrInvalidKey)
			assert.Empty(t, rt.sent, "nothing sent")
			assert.Zero(t, store.Len(), "nothing journaled")
		})
	}
	t.Run("the same key twice", func(t *testing.T) {
		rt := &scriptRT{steps: []step{resp(201)}}
		c, _ := newTestClient(rt)
		defer c.Close()
		req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", strings.NewReader("a"))
		require.NoError(t, err)
		req.Header = http.Header{"Idempotency-Key": {"k-one", "k-one"}}
		r, err := c.HTTPClient().Do(req)
		require.NoError(t, err)
		r.Body.Close()
		require.Len(t, rt.sent, 1)
		assert.Equal(t, "k-one", rt.sent[0].key)
	})
}

func TestKeyChoice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{resp(200)}}
		c, _ := newTestClient(rt)
		defer c.Close()
		send := func(ctx context.Context, headerKey, body string) (string, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://pay.example/v1/charges", strings.NewReader(body))
			require.NoError(t, err)
			if headerKey != "" {
				req.Header.Set("Idempotency-Key", headerKey)
			}
			r, err := c.HTTPClient().Do(req)
			if err != nil {
				return "", err
			}
			r.Body.Close()
			return rt.sent[len(rt.sent)-1].key, nil
		}
		bg := context.Background()

		k, err := send(bg, "", "a")
		require.NoError(t, err)
		assert.Len(t, k, 36, "a new UUID")
		assert.Equal(t, byte('7'), k[14], "UUIDv7")
		k2, err := send(bg, "", "a")
		require.NoError(t, err)
		assert.NotEqual(t, k, k2, "each call a new key")

		k, err = send(bg, "sdk-key-1", "b")
		require.NoError(t, err)
		assert.Equal(t, "sdk-key-1", k, "a header key is kept")

		k, err = send(idem.WithKey(bg, "mine-1"), "sdk-key-2", "c")
		require.NoError(t, err)
		assert.Equal(t, "mine-1", k, "WithKey outranks the header")

		ctx := idem.WithOperation(bg, "pay:order-42")
		k1, err := send(ctx, "sdk-fresh-1", "d")
		require.NoError(t, err)
		k2, err = send(ctx, "sdk-fresh-2", "d")
		require.NoError(t, err)
		assert.Equal(t, k1, k2, "a named operation keeps its key under SDK keys")
		assert.NotEqual(t, "sdk-fresh-1", k1)

		_, err = send(ctx, "", "other payload")
		require.ErrorIs(t, err, idem.ErrKeyReused)
		_, err = send(bg, "sdk-key-1", "other payload")
		require.ErrorIs(t, err, idem.ErrKeyReused)
		n := len(rt.sent)
		for _, bad := range []string{strings.Repeat("k", 256), "has space", "ctl\x01"} {
			_, err = send(idem.WithKey(bg, bad), "", "e")
			require.ErrorIs(t, err, idem.ErrInvalidKey, "key %q", bad)
		}
		_, err = send(idem.WithKey(bg, ""), "", "e")
		require.ErrorIs(t, err, idem.ErrInvalidKey)
		assert.Len(t, rt.sent, n, "refused requests are not sent")
	})
}

func TestRefusedBeforeSending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{resp(200)}}
		c, store := newTestClient(rt, idem.WithMaxBodyBytes(8))
		defer c.Close()

		_, err := post(t, context.Background(), c.HTTPClient(), "123456789")
		require.ErrorIs(t, err, idem.ErrBodyTooLarge)

		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err = post(t, ctx, c.HTTPClient(), "1")
		require.ErrorIs(t, err, context.Canceled)

		assert.Empty(t, rt.sent)
		pend, err := store.Pending(context.Background(), "", 10)
		require.NoError(t, err)
		assert.Empty(t, pend, "nothing journaled")
	})
}

func TestLargeBodyOptIn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{resp(200)}}
		c, store := newTestClient(rt, idem.WithMaxBodyBytes(8), idem.WithUnjournaledLargeBodies())
		defer c.Close()
		r, err := post(t, context.Background(), c.HTTPClient(), "0123456789abcdef")
		require.NoError(t, err)
		r.Body.Close()
		require.Len(t, rt.sent, 1)
		assert.Equal(t, "0123456789abcdef", rt.sent[0].body)
		assert.NotEmpty(t, rt.sent[0].key)
		op, err := store.Get(context.Background(), rt.sent[0].key)
		require.NoError(t, err, "key and fingerprint are journaled")
		assert.True(t, op.Unreplayable, "the body is not")
		assert.Equal(t, idem.StateSucceeded, op.State)
	})
}

func TestSecretsNotJournaled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{fail(errReset)}}
		c, store := newTestClient(rt, idem.WithMaxAttempts(1), idem.WithSecretHeaders("X-Api-Secret"))
		defer c.Close()
		req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", strings.NewReader("{}"))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer sk_live_1")
		req.Header.Set("Cookie", "s=1")
		req.Header.Set("X-Api-Secret", "shh")
		req.Header.Set("X-Trace", "t1")
		_, err = c.HTTPClient().Do(req)
		require.ErrorIs(t, err, idem.ErrAttemptsExhausted)
		pend, err := store.Pending(context.Background(), "", 10)
		require.NoError(t, err)
		require.Len(t, pend, 1)
		h := pend[0].Header
		assert.Empty(t, h.Get("Authorization"))
		assert.Empty(t, h.Get("Cookie"))
		assert.Empty(t, h.Get("X-Api-Secret"))
		assert.Equal(t, "t1", h.Get("X-Trace"))
	})
}

func TestConcurrentSameNameWaitsThenReDrives(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		entered := make(chan struct{}, 4)
		var mu sync.Mutex
		var keys []string
		rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			keys = append(keys, r.Header.Get("Idempotency-Key"))
			first := len(keys) == 1
			mu.Unlock()
			if first {
				entered <- struct{}{}
				<-release
			}
			return &http.Response{StatusCode: 201, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
		})
		c, store := newTestClient(rt)
		defer c.Close()
		ctx := idem.WithOperation(context.Background(), "book:seat-7")
		done := make(chan error)
		go func() {
			r, err := post(t, ctx, c.HTTPClient(), "{}")
			if err == nil {
				io.ReadAll(r.Body)
				r.Body.Close()
			}
			done <- err
		}()
		<-entered
		op, err := store.Named(context.Background(), "book:seat-7")
		require.NoError(t, err)

		// A double tap with a deadline gives up waiting, with the journaled key.
		short, cancel := context.WithTimeout(ctx, time.Second)
		_, err = post(t, short, c.HTTPClient(), "{}")
		cancel()
		require.ErrorIs(t, err, idem.ErrInProgress)
		var ie *idem.Error
		require.ErrorAs(t, err, &ie)
		assert.Equal(t, op.Key, ie.Key, "the error carries the journaled key, not a candidate")

		// One without a deadline waits for the first to settle, then re-drives the same key.
		second := make(chan error)
		go func() {
			r, err := post(t, ctx, c.HTTPClient(), "{}")
			if err == nil {
				r.Body.Close()
			}
			second <- err
		}()
		synctest.Wait()
		mu.Lock()
		assert.Len(t, keys, 1, "the second call waits and sends nothing while the first runs")
		mu.Unlock()
		close(release)
		require.NoError(t, <-done)
		require.NoError(t, <-second)
		assert.Equal(t, []string{op.Key, op.Key}, keys, "one key for both calls")
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestRetryBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{resp(503)}}
		c, _ := newTestClient(rt, idem.WithRetryBudget(0.25, 2))
		defer c.Close()
		attemptsOf := func(url string) int {
			n := len(rt.sent)
			req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("{}"))
			require.NoError(t, err)
			r, err := c.HTTPClient().Do(req)
			require.NoError(t, err)
			r.Body.Close()
			assert.Equal(t, 503, r.StatusCode, "the last response is returned as it is")
			return len(rt.sent) - n
		}
		// A host starts with a full bucket of 2 retries; each call adds 0.25.
		var got []int
		for range 5 {
			got = append(got, attemptsOf("https://a.example/pay"))
		}
		assert.Equal(t, []int{3, 1, 1, 1, 2}, got)
		assert.Equal(t, 3, attemptsOf("https://b.example/pay"), "each host has its own budget")
	})
}

func TestClosedClientSendsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{resp(200)}}
		c, _ := newTestClient(rt)
		require.NoError(t, c.Close())
		_, err := post(t, context.Background(), c.HTTPClient(), "{}")
		require.ErrorIs(t, err, idem.ErrClosed)
		assert.Empty(t, rt.sent, "a request whose key cannot be journaled is not sent")
	})
}

func TestCustomHeaderAndMethods(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var got []http.Header
		rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			got = append(got, r.Header.Clone())
			if r.Body != nil {
				r.Body.Close()
			}
			return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
		})
		c, store := newTestClient(rt, idem.WithKeyHeader("paypal-request-id"), idem.WithKeyedMethods("POST", "PUT"))
		defer c.Close()
		for _, m := range []string{http.MethodPut, http.MethodPatch} {
			req, err := http.NewRequest(m, "https://api.paypal.example/v2/orders", strings.NewReader("{}"))
			require.NoError(t, err)
			r, err := c.HTTPClient().Do(req)
			require.NoError(t, err)
			r.Body.Close()
		}
		require.Len(t, got, 2)
		key := got[0].Get("PayPal-Request-Id")
		assert.NotEmpty(t, key, "PUT is keyed, under the configured header")
		assert.Empty(t, got[0].Get("Idempotency-Key"))
		assert.Empty(t, got[1].Get("PayPal-Request-Id"), "PATCH is no longer keyed")
		op, err := store.Get(context.Background(), key)
		require.NoError(t, err)
		assert.Equal(t, http.MethodPut, op.Method)
	})
}
