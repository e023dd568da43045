package idem_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
)

// sdkCall imitates the retry loop of openai-go and anthropic-sdk-go: up to
// tries requests, each a fresh request through hc (so a fresh RoundTrip),
// the same body, no key of its own, and X-Stainless-Retry-Count on the
// retries. It retries on an error, 408, 409, 429 and 5xx, reads every
// answer to its end, and returns the last status and body.
func sdkCall(t *testing.T, hc *http.Client, url, body string, tries int) (int, string, error) {
	t.Helper()
	var (
		status int
		text   string
		err    error
	)
	for i := range tries {
		req, rerr := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		require.NoError(t, rerr)
		req.Header.Set("Content-Type", "application/json")
		if i > 0 {
			req.Header.Set("X-Stainless-Retry-Count", strconv.Itoa(i))
		}
		var resp *http.Response
		resp, err = hc.Do(req)
		if err != nil {
			status, text = 0, ""
			continue
		}
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, rerr)
		status, text = resp.StatusCode, string(b)
		if status != 408 && status != 409 && status != 429 && status < 500 {
			return status, text, nil
		}
	}
	return status, text, err
}

// TestCallerRetriesWithoutKey drives idem under an SDK that retries on its
// own, a fresh RoundTrip per retry and no key: the SDK's retries of one
// call carry one key and the operation is performed once; a deliberate
// second identical call after a received 2xx is a new operation.
func TestCallerRetriesWithoutKey(t *testing.T) {
	tests := []struct {
		name   string
		faults []idemtest.Fault // on the first key's attempts
	}{
		{"lost response, then 503", []idemtest.Fault{idemtest.DropAfter, idemtest.Unavailable}},
		{"503, then lost response", []idemtest.Fault{idemtest.Unavailable, idemtest.DropAfter}},
		{"429, then lost response", []idemtest.Fault{idemtest.TooManyRequests, idemtest.DropAfter}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, firstKey := chargeServer(t, tt.faults...)
			store := idem.NewMemoryStore()
			// One attempt per RoundTrip: every retry is the SDK's.
			c := idem.New(store, idem.WithBaseTransport(srv.Client().Transport), idem.WithMaxAttempts(1))
			defer c.Close()

			status, body, err := sdkCall(t, c.HTTPClient(), srv.URL+"/v1/chat/completions", `{"model":"m","n":1}`, 3)
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, status)
			assert.Equal(t, "charge 1", body)
			first := firstKey()
			st := srv.Stats()
			assert.Equal(t, 3, st.Requests)
			require.Len(t, st.AttemptsByKey, 1, "the SDK's retries carried one key: %v", st.AttemptsByKey)
			assert.Equal(t, first, keysOf(st.AttemptsByKey)[0])
			assert.NotEmpty(t, first)
			assert.Equal(t, 1, st.RunsByKey[first], "performed once")
			assert.Equal(t, 0, st.DuplicatePayloads())
			op, err := store.Get(context.Background(), first)
			require.NoError(t, err)
			assert.Equal(t, idem.StateSucceeded, op.State)
			assert.Equal(t, 3, op.Attempts)

			// The caller read the 2xx to its end: an identical call now is a
			// second operation, deliberately.
			status, body, err = sdkCall(t, c.HTTPClient(), srv.URL+"/v1/chat/completions", `{"model":"m","n":1}`, 3)
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, status)
			assert.Equal(t, "charge 2", body)
			st = srv.Stats()
			require.Len(t, st.AttemptsByKey, 2, "the second call has a key of its own")
			for k, n := range st.AttemptsByKey {
				if k != first {
					assert.Equal(t, 1, n)
					assert.Equal(t, 1, st.RunsByKey[k])
				}
			}
		})
	}
}

func keysOf(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// hijackCutOff answers 200 with a Content-Length of 100 but only 10 bytes
// of body, then closes the connection.
func hijackCutOff(t *testing.T, w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body) // nothing unread, so the close is a FIN, not a reset
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return
	}
	buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 100\r\nContent-Type: text/plain\r\n\r\n0123456789")
	buf.Flush()
	conn.Close()
}

// TestCutOffAnswerStaysInDoubt checks that a 2xx whose body is cut off
// mid-read is not an answer the caller received: the operation stays
// pending, and the caller's resend of the same payload uses its key.
func TestCutOffAnswerStaysInDoubt(t *testing.T) {
	var (
		mu   sync.Mutex
		keys []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n := len(keys)
		mu.Unlock()
		if n == 1 {
			hijackCutOff(t, w, r)
			return
		}
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("charged"))
	}))
	defer srv.Close()
	store := idem.NewMemoryStore()
	c := idem.New(store, idem.WithBaseTransport(srv.Client().Transport))
	defer c.Close()
	hc := c.HTTPClient()
	send := func() (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"amount":1}`))
		require.NoError(t, err)
		return hc.Do(req)
	}

	resp, err := send()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	_, err = io.ReadAll(resp.Body)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	resp.Body.Close()
	mu.Lock()
	require.Len(t, keys, 1)
	key := keys[0]
	mu.Unlock()
	op, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, op.State, "the caller never learned the answer")

	resp, err = send()
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, "charged", string(b))
	mu.Lock()
	assert.Equal(t, []string{key, key}, keys, "the resend of the same payload carries the same key")
	mu.Unlock()
	op, err = store.Get(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, op.State)
}

// TestStreamedAnswer checks that a streamed answer reaches the caller as
// it comes: the first chunk is readable while the server still holds the
// second.
func TestStreamedAnswer(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: two\n\n")
	}))
	defer srv.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	store := idem.NewMemoryStore()
	c := idem.New(store, idem.WithBaseTransport(srv.Client().Transport))
	defer c.Close()
	// The deadline only keeps a buffering transport from hanging the test:
	// the assertions do not depend on time.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/stream", strings.NewReader(`{"stream":true}`))
	require.NoError(t, err)
	resp, err := c.HTTPClient().Do(req)
	require.NoError(t, err, "the response arrives before the stream ends")
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	require.NoError(t, err, "the first chunk is readable while the server holds the second")
	assert.Equal(t, "data: one\n", line)
	close(release)
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.Equal(t, "\ndata: two\n\n", string(rest))
	key := resp.Request.Header.Get("Idempotency-Key")
	require.NotEmpty(t, key)
	op, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, op.State, "read to its end: settled")
}

// TestResendMatchKeepsPrincipalsApart checks that a call is taken for the
// resend of a recent call in doubt only when it comes with the same
// credentials: the same payload sent for another account (another API
// key, in a header or in the query) is another operation, and must not
// get the first account's key.
func TestResendMatchKeepsPrincipalsApart(t *testing.T) {
	tests := []struct {
		name    string
		url1    string
		url2    string
		auth1   string
		auth2   string
		sameKey bool
	}{
		{"same credentials: a resend", "https://pay.example/v1/charges", "https://pay.example/v1/charges", "Bearer sk_A", "Bearer sk_A", true},
		{"another Authorization", "https://pay.example/v1/charges", "https://pay.example/v1/charges", "Bearer sk_A", "Bearer sk_B", false},
		{"another api_key", "https://pay.example/v1/charges?api_key=A", "https://pay.example/v1/charges?api_key=B", "", "", false},
		{"another URL user", "https://a:pw@pay.example/v1/charges", "https://b:pw@pay.example/v1/charges", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rt := &scriptRT{steps: []step{fail(errReset), resp(201)}}
				c, _ := newTestClient(rt, idem.WithMaxAttempts(1))
				defer c.Close()
				send := func(u, auth string) (*http.Response, error) {
					req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(`{"amount":100}`))
					require.NoError(t, err)
					if auth != "" {
						req.Header.Set("Authorization", auth)
					}
					return c.HTTPClient().Do(req)
				}
				_, err := send(tt.url1, tt.auth1)
				require.ErrorIs(t, err, idem.ErrAttemptsExhausted, "the first call is in doubt")
				r, err := send(tt.url2, tt.auth2)
				require.NoError(t, err)
				r.Body.Close()
				require.Len(t, rt.sent, 2)
				if tt.sameKey {
					assert.Equal(t, rt.sent[0].key, rt.sent[1].key, "a resend reuses the key")
				} else {
					assert.NotEqual(t, rt.sent[0].key, rt.sent[1].key, "another principal's call got the first one's key")
				}
			})
		})
	}
}

// TestResendAfterFinal409KeepsKey: a 409 "in progress" that ends a call's
// attempts is no definite answer, so the caller's own resend must keep the
// key: the first request may still be running at the server.
func TestResendAfterFinal409KeepsKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &scriptRT{steps: []step{resp(409), resp(409), resp(201)}}
		c, _ := newTestClient(rt, idem.WithMaxAttempts(2))
		defer c.Close()
		r, err := post(t, context.Background(), c.HTTPClient(), `{"amount":7}`)
		require.NoError(t, err)
		require.Equal(t, 409, r.StatusCode)
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		r, err = post(t, context.Background(), c.HTTPClient(), `{"amount":7}`)
		require.NoError(t, err)
		r.Body.Close()
		require.Len(t, rt.sent, 3)
		assert.Equal(t, rt.sent[0].key, rt.sent[2].key, "the resend after a final 409 kept the key")
	})
}
