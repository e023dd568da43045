package idem_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
)

// TestOverLoopback sends keyed POSTs through real connections to an
// idemtest server that injects each fault on the first attempts, and
// checks that the handler ran once under one key.
func TestOverLoopback(t *testing.T) {
	tests := []struct {
		name     string
		faults   []idemtest.Fault
		attempts int
	}{
		{"no fault", nil, 1},
		{"connection dropped before handling", []idemtest.Fault{idemtest.DropBefore}, 2},
		{"response lost after handling", []idemtest.Fault{idemtest.DropAfter}, 2},
		{"503 then 429", []idemtest.Fault{idemtest.Unavailable, idemtest.TooManyRequests}, 3},
		{"409 in progress", []idemtest.Fault{idemtest.InProgress, idemtest.InProgress}, 3},
		{"lost, then 503, then lost", []idemtest.Fault{idemtest.DropAfter, idemtest.Unavailable, idemtest.DropAfter}, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "charged %s", b)
			})
			srv := idemtest.NewServer(h, idemtest.WithRetryAfter(0), idemtest.WithScript(func(_ string, attempt int) idemtest.Fault {
				if attempt <= len(tt.faults) {
					return tt.faults[attempt-1]
				}
				return idemtest.NoFault
			}))
			defer srv.Close()
			c := idem.New(idem.NewMemoryStore(), idem.WithBaseTransport(srv.Client().Transport), idem.WithBackoff(time.Millisecond, 5*time.Millisecond))
			defer c.Close()

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"amount":1}`))
			require.NoError(t, err)
			resp, err := c.HTTPClient().Do(req)
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			assert.Equal(t, `charged {"amount":1}`, string(body))

			st := srv.Stats()
			assert.Equal(t, tt.attempts, st.Requests)
			assert.Len(t, st.AttemptsByKey, 1, "one key on every attempt")
			assert.Equal(t, int64(1), runs.Load(), "performed exactly once")
			assert.Equal(t, 0, st.DuplicateKeys())
			assert.Equal(t, 0, st.Mismatches, "the body was identical on every attempt")
		})
	}
}

// TestOverLoopbackDeadline checks that a request whose server keeps
// failing stops at the caller's deadline with the operation left pending.
func TestOverLoopbackDeadline(t *testing.T) {
	srv := idemtest.NewServer(http.NotFoundHandler(), idemtest.WithScript(func(string, int) idemtest.Fault { return idemtest.DropBefore }))
	defer srv.Close()
	store := idem.NewMemoryStore()
	c := idem.New(store, idem.WithBaseTransport(srv.Client().Transport), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 100, Initial: 200 * time.Millisecond, Max: 200 * time.Millisecond, NoJitter: true}))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/x", strings.NewReader("{}"))
	require.NoError(t, err)
	_, err = c.HTTPClient().Do(req)
	// Two attempts 200ms apart; the next wait would end past the deadline,
	// so it stopped after the second attempt instead of sleeping into it.
	require.ErrorIs(t, err, idem.ErrDeadline)
	var ie *idem.Error
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, idem.StatePending, ie.State)
	assert.Equal(t, 2, ie.Attempts)
}

// TestRedirects checks that a redirect which would re-send a keyed POST is
// returned to the caller, and that POST-redirect-GET is followed.
func TestRedirects(t *testing.T) {
	var posts, gets atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /pay-307", func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("POST /pay-303", func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		http.Redirect(w, r, "/receipt", http.StatusSeeOther)
	})
	mux.HandleFunc("GET /receipt", func(w http.ResponseWriter, r *http.Request) {
		gets.Add(1)
		fmt.Fprint(w, "receipt")
	})
	mux.HandleFunc("/elsewhere", func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("%s /elsewhere: a keyed POST was re-sent to another URL", r.Method)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := idem.New(idem.NewMemoryStore())
	defer c.Close()
	ctx := idem.WithOperation(context.Background(), "pay:redirected")

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay-307", strings.NewReader("{}"))
	require.NoError(t, err)
	resp, err := c.HTTPClient().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusTemporaryRedirect, resp.StatusCode)
	assert.Equal(t, "/elsewhere", resp.Header.Get("Location"))

	req, err = http.NewRequest(http.MethodPost, srv.URL+"/pay-303", strings.NewReader("{}"))
	require.NoError(t, err)
	resp, err = c.HTTPClient().Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "receipt", string(body))
	assert.Equal(t, int64(2), posts.Load())
	assert.Equal(t, int64(1), gets.Load())
}

// writeCounter counts the writes made on the connections it dials.
type writeCounter struct{ writes atomic.Int64 }

func (wc *writeCounter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: c, wc: wc}, nil
}

type countedConn struct {
	net.Conn
	wc *writeCounter
}

func (c *countedConn) Write(p []byte) (int, error) {
	c.wc.writes.Add(1)
	return c.Conn.Write(p)
}

// TestSmallRequestOneWrite checks that a keyed POST with a small body
// leaves in one write, as net/http sends a request whose body it knows to
// be in memory: a body reader net/http does not recognise makes it flush
// the header first, a second write (and a second TCP segment the server
// must read) per attempt. Both the first attempt's body and a resend's
// (GetBody) are checked.
func TestSmallRequestOneWrite(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	wc := new(writeCounter)
	base := &http.Transport{DialContext: wc.dial}
	defer base.CloseIdleConnections()
	c := idem.New(idem.NewMemoryStore(), idem.WithBaseTransport(base), idem.WithBackoff(time.Millisecond, time.Millisecond))
	defer c.Close()

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"amount":1999}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.HTTPClient().Do(req)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.EqualValues(t, 2, calls.Load(), "one 503, then the resend")
	assert.EqualValues(t, 2, wc.writes.Load(), "writes for two attempts")
}
