package idem_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// pendingOf returns the pending operations of store.
func pendingOf(t *testing.T, store idem.KeyStore) []idem.Operation {
	t.Helper()
	pend, err := store.Pending(context.Background(), "", 0)
	require.NoError(t, err)
	return pend
}

// TestUnjournaledLargeBodies checks the keys of requests whose bodies are
// over the journal's limit when the Client sends them unjournaled.
func TestUnjournaledLargeBodies(t *testing.T) {
	const big, other = "0123456789abcdef", "fedcba9876543210" // over the limit of 8
	opts := []idem.Option{idem.WithMaxBodyBytes(8), idem.WithUnjournaledLargeBodies()}
	t.Run("a name twice sends one key", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rt := &scriptRT{steps: []step{resp(201)}}
			c, _ := newTestClient(rt, opts...)
			defer c.Close()
			ctx := idem.WithOperation(context.Background(), "pay:big")
			for range 2 {
				r, err := post(t, ctx, c.HTTPClient(), big)
				require.NoError(t, err)
				r.Body.Close()
			}
			require.Len(t, rt.sent, 2)
			assert.NotEmpty(t, rt.sent[0].key)
			assert.Equal(t, rt.sent[0].key, rt.sent[1].key)
			assert.Equal(t, big, rt.sent[1].body)
		})
	})
	t.Run("a key with another large body is refused", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rt := &scriptRT{steps: []step{resp(201)}}
			c, _ := newTestClient(rt, opts...)
			defer c.Close()
			ctx := idem.WithKey(context.Background(), "k1")
			r, err := post(t, ctx, c.HTTPClient(), big)
			require.NoError(t, err)
			r.Body.Close()
			_, err = post(t, ctx, c.HTTPClient(), other)
			require.ErrorIs(t, err, idem.ErrKeyReused)
			assert.Len(t, rt.sent, 1, "nothing sent for the other payload")
		})
	})
	t.Run("a large body without GetBody", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rt := &scriptRT{steps: []step{resp(201)}}
			c, store := newTestClient(rt, opts...)
			defer c.Close()
			body := &closeCounter{Reader: strings.NewReader(big)}
			req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/uploads", body)
			require.NoError(t, err)
			require.Nil(t, req.GetBody)
			_, err = c.HTTPClient().Do(req)
			require.ErrorIs(t, err, idem.ErrBodyTooLarge)
			assert.Empty(t, rt.sent)
			assert.Empty(t, pendingOf(t, store))
			assert.Positive(t, body.closed(), "the request body is closed")
		})
	})
	t.Run("resume reports the unreplayable one", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rt := &scriptRT{steps: []step{fail(errReset)}}
			c, store := newTestClient(rt, append(opts, idem.WithMaxAttempts(1))...)
			defer c.Close()
			key := leavePending(t, c, rt, context.Background(), big)
			n := len(rt.sent)
			rt.mu.Lock()
			rt.steps = []step{resp(201)}
			rt.mu.Unlock()
			fn, got := collect()
			require.NoError(t, c.Resume(context.Background(), fn))
			require.Len(t, got.list(), 1)
			o := got.list()[0]
			assert.Equal(t, key, o.op.Key)
			assert.ErrorIs(t, o.err, idem.ErrNotRetryable)
			assert.Len(t, rt.sent, n, "nothing sent")
			op, err := store.Get(context.Background(), key)
			require.NoError(t, err)
			assert.Equal(t, idem.StatePending, op.State)
		})
	})
}

// closeCounter is a request body without GetBody that counts its closes.
type closeCounter struct {
	io.Reader
	mu sync.Mutex
	n  int
}

func (c *closeCounter) Close() error { c.mu.Lock(); c.n++; c.mu.Unlock(); return nil }
func (c *closeCounter) closed() int  { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

// TestResumeNeedsCredentials checks that an operation whose credentials
// were not journaled is resent only through WithResumePrepare: without
// the hook it stays pending and is reported.
func TestResumeNeedsCredentials(t *testing.T) {
	tests := []struct {
		name    string
		url     string
		header  string // Authorization, or ""
		prepare func(*http.Request) error
		check   func(t *testing.T, s sentReq)
	}{
		{
			name: "Authorization header", url: "https://pay.example/v1/charges", header: "Bearer sk_live_1",
			prepare: func(r *http.Request) error { r.Header.Set("Authorization", "Bearer sk_live_1"); return nil },
			check:   func(t *testing.T, s sentReq) { assert.Equal(t, "Bearer sk_live_1", s.header.Get("Authorization")) },
		},
		{
			name: "URL user info", url: "https://user:pass@pay.example/v1/charges",
			prepare: func(r *http.Request) error { r.URL.User = url.UserPassword("user", "pass"); return nil },
			check:   func(t *testing.T, s sentReq) { assert.Contains(t, s.url, "user:pass@") },
		},
		{
			name: "api_key query parameter", url: "https://pay.example/v1/charges?api_key=SECRET&order=42",
			prepare: func(r *http.Request) error {
				q := r.URL.Query()
				q.Set("api_key", "SECRET")
				r.URL.RawQuery = q.Encode()
				return nil
			},
			check: func(t *testing.T, s sentReq) {
				assert.Contains(t, s.url, "api_key=SECRET")
				assert.Contains(t, s.url, "order=42")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := &scriptRT{steps: []step{fail(errReset)}}
				store := idem.NewMemoryStore()
				base := []idem.Option{idem.WithBaseTransport(rt), idem.WithMaxAttempts(1), idem.WithOwner("app")}
				c := idem.New(store, base...)
				req, err := http.NewRequest(http.MethodPost, tt.url, strings.NewReader(`{"amount":1}`))
				require.NoError(t, err)
				if tt.header != "" {
					req.Header.Set("Authorization", tt.header)
				}
				_, err = c.HTTPClient().Do(req)
				require.ErrorIs(t, err, idem.ErrAttemptsExhausted)
				require.Len(t, rt.sent, 1)
				key := rt.sent[0].key
				rt.mu.Lock()
				rt.steps = []step{resp(201)}
				rt.mu.Unlock()

				fn, got := collect()
				require.NoError(t, c.Resume(context.Background(), fn))
				require.Len(t, got.list(), 1)
				assert.ErrorIs(t, got.list()[0].err, idem.ErrNoCredentials)
				assert.Len(t, rt.sent, 1, "not sent without credentials")
				op, err := store.Get(context.Background(), key)
				require.NoError(t, err)
				assert.Equal(t, idem.StatePending, op.State)

				// The same journal, now with the hook (the same owner, so the
				// claim of the first Resume does not stand in the way).
				c2 := idem.New(store, append(base, idem.WithResumePrepare(tt.prepare))...)
				fn, got = collect()
				require.NoError(t, c2.Resume(context.Background(), fn))
				require.Len(t, got.list(), 1)
				require.NoError(t, got.list()[0].err)
				assert.Equal(t, 201, got.list()[0].status)
				require.Len(t, rt.sent, 2)
				assert.Equal(t, key, rt.sent[1].key)
				tt.check(t, rt.sent[1])
				op, err = store.Get(context.Background(), key)
				require.NoError(t, err)
				assert.Equal(t, idem.StateSucceeded, op.State)
				require.NoError(t, c2.Close())
				c.Close() // the store is closed already
			})
		})
	}
}

// TestAuthFailureToResendStaysInDoubt checks that a 401, 403 or 407 to a
// resend, by Resume or by a re-drive with the key, leaves the operation
// pending: it says nothing about the request that may have gone out.
func TestAuthFailureToResendStaysInDoubt(t *testing.T) {
	for _, status := range []int{401, 403, 407} {
		for _, how := range []string{"resume", "re-drive with WithKey"} {
			t.Run(http.StatusText(status)+"/"+how, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					rt := &scriptRT{steps: []step{fail(errReset)}}
					c, store := newTestClient(rt, idem.WithMaxAttempts(1))
					defer c.Close()
					key := leavePending(t, c, rt, context.Background(), `{"amount":1}`)
					rt.mu.Lock()
					rt.steps = []step{resp(status)}
					rt.mu.Unlock()
					switch how {
					case "resume":
						fn, got := collect()
						require.NoError(t, c.Resume(context.Background(), fn))
						require.Len(t, got.list(), 1)
						assert.Equal(t, status, got.list()[0].status)
						assert.Equal(t, idem.StatePending, got.list()[0].op.State)
					default:
						r, err := post(t, idem.WithKey(context.Background(), key), c.HTTPClient(), `{"amount":1}`)
						require.NoError(t, err)
						assert.Equal(t, status, r.StatusCode)
						io.ReadAll(r.Body)
						r.Body.Close()
					}
					require.Len(t, rt.sent, 2)
					assert.Equal(t, key, rt.sent[1].key)
					op, err := store.Get(context.Background(), key)
					require.NoError(t, err)
					assert.Equal(t, idem.StatePending, op.State, "still in doubt")
				})
			})
		}
	}
}

// TestVirtualHost checks that a request's Host header, when it differs
// from the URL's host, is journaled and sent again by Resume.
func TestVirtualHost(t *testing.T) {
	var (
		mu    sync.Mutex
		hosts []string
		keys  []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hosts = append(hosts, r.Host)
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n := len(hosts)
		mu.Unlock()
		io.Copy(io.Discard, r.Body)
		if n == 1 { // the answer is lost
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	store := idem.NewMemoryStore()
	c := idem.New(store, idem.WithBaseTransport(srv.Client().Transport), idem.WithMaxAttempts(1))
	defer c.Close()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/pay", strings.NewReader("{}"))
	require.NoError(t, err)
	req.Host = "payments.internal"
	_, err = c.HTTPClient().Do(req)
	require.ErrorIs(t, err, idem.ErrAttemptsExhausted)
	mu.Lock()
	require.Equal(t, []string{"payments.internal"}, hosts)
	key := keys[0]
	mu.Unlock()
	op, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, "payments.internal", op.Host)

	fn, got := collect()
	require.NoError(t, c.Resume(context.Background(), fn))
	require.Len(t, got.list(), 1)
	require.NoError(t, got.list()[0].err)
	assert.Equal(t, http.StatusCreated, got.list()[0].status)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"payments.internal", "payments.internal"}, hosts, "Resume sends the virtual host")
	assert.Equal(t, []string{key, key}, keys)
}
