package idem_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// TestServerHints checks that a server's explicit retry hints win over the
// status table, and that 529 is transient.
func TestServerHints(t *testing.T) {
	tests := []struct {
		name   string
		first  step
		sent   int           // requests the server sees
		status int           // status the caller gets
		gap    time.Duration // wait between the first two requests, if exact
	}{
		{"Stripe-Should-Retry false on a 500", resp(500, "Stripe-Should-Retry", "false"), 1, 500, 0},
		{"X-Should-Retry false on a 503", resp(503, "X-Should-Retry", "false"), 1, 503, 0},
		{"X-Should-Retry true on a 400", resp(400, "X-Should-Retry", "true"), 2, 201, 0},
		{"Stripe-Should-Retry true on a 409 key reuse", step{status: 409, header: http.Header{"Stripe-Should-Retry": {"true"}}, body: `{"error":{"code":"idempotency_key_already_used"}}`}, 2, 201, 0},
		{"Retry-After-Ms 1500", resp(503, "Retry-After-Ms", "1500"), 2, 201, 1500 * time.Millisecond},
		{"Retry-After-Ms wins over Retry-After", resp(429, "Retry-After-Ms", "250", "Retry-After", "9"), 2, 201, 250 * time.Millisecond},
		{"529 overloaded", resp(529), 2, 201, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := &scriptRT{steps: []step{tt.first, resp(201)}}
				// Backoff waits of an hour show that a gap came from the server.
				c, _ := newTestClient(rt, idem.WithRetryPolicy(idem.RetryPolicy{Initial: time.Hour, Max: time.Hour, MaxElapsed: 10 * time.Hour, NoJitter: true}))
				defer c.Close()
				r, err := post(t, context.Background(), c.HTTPClient(), "{}")
				require.NoError(t, err)
				io.ReadAll(r.Body)
				r.Body.Close()
				assert.Equal(t, tt.status, r.StatusCode)
				require.Len(t, rt.sent, tt.sent)
				if tt.gap > 0 {
					assert.Equal(t, tt.gap, rt.sent[1].at.Sub(rt.sent[0].at))
				}
			})
		})
	}
}

// TestSilentReplayCounted checks that net/http's own silent resend of a
// keyed request on a reused connection counts as an attempt.
func TestSilentReplayCounted(t *testing.T) {
	var (
		mu    sync.Mutex
		seen  int
		byKey = map[string]int{}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen++
		n := seen
		byKey[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		if n == 2 { // the first request on the reused connection: no answer
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	tr := srv.Client().Transport.(*http.Transport) // keep-alive
	store := idem.NewMemoryStore()
	c := idem.New(store, idem.WithBaseTransport(tr), idem.WithMaxAttempts(1))
	defer c.Close()

	var keys []string
	for _, body := range []string{`{"n":1}`, `{"n":2}`} {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(body))
		require.NoError(t, err)
		r, err := c.HTTPClient().Do(req)
		require.NoError(t, err, "net/http resends on a new connection by itself")
		b, err := io.ReadAll(r.Body)
		r.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, "ok", string(b))
		keys = append(keys, r.Request.Header.Get("Idempotency-Key"))
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 3, seen, "the second request was written twice")
	for i, key := range keys {
		op, err := store.Get(context.Background(), key)
		require.NoError(t, err)
		assert.Equal(t, byKey[key], op.Attempts, "operation %d: journaled attempts = POSTs the server saw", i+1)
		assert.Equal(t, idem.StateSucceeded, op.State)
	}
	assert.Equal(t, 2, byKey[keys[1]])
}

// TestKeyHeaderSpelling checks that a key in a non-canonical header
// spelling is the operation's key, sent once.
func TestKeyHeaderSpelling(t *testing.T) {
	for _, name := range []string{"idempotency-key", "IDEMPOTENCY-KEY", "Idempotency-Key"} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := &scriptRT{steps: []step{resp(201)}}
				c, store := newTestClient(rt)
				defer c.Close()
				req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", strings.NewReader("{}"))
				require.NoError(t, err)
				req.Header[name] = []string{"k-lower"}
				r, err := c.Transport().RoundTrip(req)
				require.NoError(t, err)
				r.Body.Close()
				require.Len(t, rt.sent, 1)
				var got []string
				for k, vs := range rt.sent[0].header {
					if strings.EqualFold(k, "Idempotency-Key") {
						got = append(got, vs...)
					}
				}
				assert.Equal(t, []string{"k-lower"}, got, "exactly one key header")
				op, err := store.Get(context.Background(), "k-lower")
				require.NoError(t, err)
				assert.Equal(t, idem.StateSucceeded, op.State)
			})
		})
	}
}

// TestErrorTextsShort checks that errors quote and shorten the keys and
// names they carry: one line, of a size fit for a log.
func TestErrorTextsShort(t *testing.T) {
	const maxLen = 300
	longName := strings.Repeat("n", 500) + "\nFAKE LOG LINE " + strings.Repeat("n", 500) // 1,014 bytes: a valid name
	longKey := strings.Repeat("k", 255)                                                  // the longest valid key
	tests := []struct {
		name string
		run  func(t *testing.T, c *idem.Client) error
		want error
	}{
		{"a 1 MB name", func(t *testing.T, c *idem.Client) error {
			_, err := post(t, idem.WithOperation(context.Background(), strings.Repeat("x\n", 1<<19)), c.HTTPClient(), "{}")
			return err
		}, idem.ErrInvalidKey},
		{"a key with a newline", func(t *testing.T, c *idem.Client) error {
			_, err := post(t, idem.WithKey(context.Background(), "k1\nFAKE LOG LINE"), c.HTTPClient(), "{}")
			return err
		}, idem.ErrInvalidKey},
		{"a 1 MB key", func(t *testing.T, c *idem.Client) error {
			_, err := post(t, idem.WithKey(context.Background(), strings.Repeat("k\n", 1<<19)), c.HTTPClient(), "{}")
			return err
		}, idem.ErrInvalidKey},
		{"a header key with a newline", func(t *testing.T, c *idem.Client) error {
			req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", strings.NewReader("{}"))
			require.NoError(t, err)
			req.Header["Idempotency-Key"] = []string{"k1\nFAKE LOG LINE"}
			_, err = c.Transport().RoundTrip(req)
			return err
		}, idem.ErrInvalidRequest},
		{"a 1 MB header name", func(t *testing.T, c *idem.Client) error {
			req, err := http.NewRequest(http.MethodPost, "https://pay.example/v1/charges", strings.NewReader("{}"))
			require.NoError(t, err)
			req.Header[strings.Repeat("h\n", 1<<19)] = []string{"v"}
			_, err = c.Transport().RoundTrip(req)
			return err
		}, idem.ErrInvalidRequest},
		{"a long name with a newline, reused with another payload", func(t *testing.T, c *idem.Client) error {
			ctx := idem.WithOperation(context.Background(), longName)
			r, err := post(t, ctx, c.HTTPClient(), `{"n":1}`)
			require.NoError(t, err)
			r.Body.Close()
			_, err = post(t, ctx, c.HTTPClient(), `{"n":2}`)
			return err
		}, idem.ErrKeyReused},
		{"the longest key, reused with another payload", func(t *testing.T, c *idem.Client) error {
			ctx := idem.WithKey(context.Background(), longKey)
			r, err := post(t, ctx, c.HTTPClient(), `{"n":1}`)
			require.NoError(t, err)
			r.Body.Close()
			_, err = post(t, ctx, c.HTTPClient(), `{"n":2}`)
			return err
		}, idem.ErrKeyReused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := &scriptRT{steps: []step{resp(201)}}
				c, _ := newTestClient(rt)
				defer c.Close()
				err := tt.run(t, c)
				require.ErrorIs(t, err, tt.want)
				text := err.Error()
				assert.NotContains(t, text, "\n", "one line")
				assert.Less(t, len(text), maxLen, "error text: %.400s", text)
			})
		})
	}
}
