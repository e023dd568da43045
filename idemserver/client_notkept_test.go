package idemserver_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
)

// dropFirst is a base RoundTripper that serves requests with h in
// process and loses the first answer on the way back, after h ran, as a
// connection cut after the server answered.
type dropFirst struct {
	h     http.Handler
	calls atomic.Int32
}

func (d *dropFirst) RoundTrip(r *http.Request) (*http.Response, error) {
	w := httptest.NewRecorder()
	d.h.ServeHTTP(w, r)
	if r.Body != nil {
		r.Body.Close()
	}
	if d.calls.Add(1) == 1 {
		return nil, io.ErrUnexpectedEOF
	}
	resp := w.Result()
	resp.Request = r
	return resp, nil
}

// tooLargeToKeep returns a route of idemserver's middleware whose handler
// counts its runs and answers status with a body too large to keep.
func tooLargeToKeep(runs *atomic.Int32, status int) http.Handler {
	return idemserver.New(idemserver.NewMemoryStore(), idemserver.WithSingleTenant(), idemserver.WithMaxResponseBytes(16)).Required(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			io.Copy(io.Discard, r.Body)
			w.WriteHeader(status)
			io.WriteString(w, strings.Repeat("charged ", 8)) // over 16 bytes: not kept
		}))
}

// TestClientRecordsNotKeptAsPerformed: idem's client calls idemserver's
// middleware in front of a handler whose answer is too large to keep; the
// first answer is lost, so the retry under the same key gets 409
// ProblemNotKept. The handler ran once, the caller gets the 409 with its
// body, and the client's journal records what the server says happened:
// finished, performed, with the original status (a 2xx: succeeded), never
// "failed 409", which an operator would read as "not charged".
func TestClientRecordsNotKeptAsPerformed(t *testing.T) {
	for _, tt := range []struct {
		name     string
		original int
		state    idem.State
		text     string
	}{
		{"201", http.StatusCreated, idem.StateSucceeded, "performed by server, answer not kept (original status 201)"},
		{"402", http.StatusPaymentRequired, idem.StateFailed, "performed by server, answer not kept (original status 402)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var runs atomic.Int32
			h := tooLargeToKeep(&runs, tt.original)
			store := idem.NewMemoryStore()
			c := idem.New(store, idem.WithBaseTransport(&dropFirst{h: h}),
				idem.WithBackoff(time.Millisecond, time.Millisecond), idem.WithMaxAttempts(4))
			defer c.Close()
			ctx := idem.WithKey(context.Background(), "k-notkept")
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://pay.test/v1/charges", strings.NewReader(`{"amount":1}`))
			require.NoError(t, err)
			resp, err := c.HTTPClient().Do(req)
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			resp.Body.Close()

			assert.EqualValues(t, 1, runs.Load(), "the handler ran once")
			assert.Equal(t, http.StatusConflict, resp.StatusCode, "the caller gets the honest answer")
			assert.Contains(t, string(body), idemserver.ProblemNotKept, "its body intact")
			op, err := store.Get(context.Background(), "k-notkept")
			require.NoError(t, err)
			assert.Equal(t, tt.state, op.State)
			assert.Equal(t, tt.original, op.LastStatus)
			assert.Equal(t, tt.text, op.LastError)
			assert.Equal(t, 2, op.Attempts, "not sent again after the 409")
		})
	}
}

// TestResumeRecordsNotKeptAsPerformed: the call's only attempt lost the
// answer, so the operation stays in doubt; Resume sends it again, gets
// 409 ProblemNotKept, and both its handler and the journal see it
// performed with the original status, the handler not run again.
func TestResumeRecordsNotKeptAsPerformed(t *testing.T) {
	var runs atomic.Int32
	h := tooLargeToKeep(&runs, http.StatusCreated)
	store := idem.NewMemoryStore()
	c := idem.New(store, idem.WithBaseTransport(&dropFirst{h: h}), idem.WithMaxAttempts(1))
	defer c.Close()
	ctx := idem.WithKey(context.Background(), "k-resumed")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://pay.test/v1/charges", strings.NewReader(`{"amount":1}`))
	require.NoError(t, err)
	_, err = c.HTTPClient().Do(req)
	require.Error(t, err, "the answer was lost")
	op, err := store.Get(context.Background(), "k-resumed")
	require.NoError(t, err)
	require.Equal(t, idem.StatePending, op.State)

	var got []idem.Operation
	require.NoError(t, c.Resume(context.Background(), func(op idem.Operation, resp *http.Response, err error) {
		require.NoError(t, err)
		assert.Equal(t, http.StatusConflict, resp.StatusCode)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Contains(t, string(body), idemserver.ProblemNotKept)
		got = append(got, op)
	}))
	require.Len(t, got, 1)
	assert.Equal(t, idem.StateSucceeded, got[0].State)
	assert.Equal(t, http.StatusCreated, got[0].LastStatus)
	assert.EqualValues(t, 1, runs.Load(), "the handler ran once")
	op, err = store.Get(context.Background(), "k-resumed")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, op.State)
	assert.Equal(t, http.StatusCreated, op.LastStatus)
	assert.Equal(t, "performed by server, answer not kept (original status 201)", op.LastError)
}

// TestClientRecordsHijackedAsPerformed: a handler that hijacked its
// connection and closed it without an answer the client could read; the
// retries under the key get 409 ProblemNotKept without original_status.
// The journal records it failed with 409, its text saying the request was
// performed and its status unknown, and the handler ran once.
func TestClientRecordsHijackedAsPerformed(t *testing.T) {
	var runs atomic.Int32
	h := idemserver.New(idemserver.NewMemoryStore(), idemserver.WithSingleTenant()).Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		io.Copy(io.Discard, r.Body)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		conn.Close() // performed; the answer went some other way
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	store := idem.NewMemoryStore()
	// The not-kept record is written once the handler returned, so a
	// retry may first get 409 in progress: Retry-After is capped to 1ms,
	// and attempts are bounded.
	c := idem.New(store, idem.WithBaseTransport(&http.Transport{DisableKeepAlives: true}),
		idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 50, Initial: time.Millisecond, Max: time.Millisecond, RetryAfterCap: time.Millisecond}))
	defer c.Close()
	ctx := idem.WithKey(context.Background(), "k-hijacked")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"amount":1}`))
	require.NoError(t, err)
	resp, err := c.HTTPClient().Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	require.Contains(t, string(body), idemserver.ProblemNotKept)
	assert.NotContains(t, string(body), "original_status")
	assert.EqualValues(t, 1, runs.Load(), "the handler ran once")
	op, err := store.Get(context.Background(), "k-hijacked")
	require.NoError(t, err)
	assert.Equal(t, idem.StateFailed, op.State)
	assert.Equal(t, http.StatusConflict, op.LastStatus)
	assert.Equal(t, "performed by server, answer not kept (status unknown)", op.LastError)
}
