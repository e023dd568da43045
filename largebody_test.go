package idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// TestLargeBodyChangedIsStopped: with WithUnjournaledLargeBodies, a
// request whose GetBody returns other bytes for the retry (after the
// request's own body, the fingerprint's pass and the first attempt) is
// caught as the retry streams: the call stops with ErrBodyChanged before
// any further attempt, and the key never carries a second payload whole.
func TestLargeBodyChangedIsStopped(t *testing.T) {
	rt := &scriptRT{steps: []step{resp(503), resp(201)}}
	c, store := newTestClient(rt, idem.WithMaxBodyBytes(8), idem.WithUnjournaledLargeBodies(),
		idem.WithBackoff(time.Millisecond, time.Millisecond))
	defer c.Close()
	var calls atomic.Int32
	body := func() string {
		if calls.Add(1) >= 4 { // the request's own body, the fingerprint's pass, the first attempt; then the retry
			return `{"amount":9999}`
		}
		return `{"amount":1000}`
	}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "https://pay.example/v1/charges", strings.NewReader(body()))
	require.NoError(t, err)
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body())), nil }
	_, err = c.HTTPClient().Do(req)
	require.ErrorIs(t, err, idem.ErrBodyChanged)
	var ie *idem.Error
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, idem.StatePending, ie.State, "the first attempt may have been performed: in doubt")
	require.Len(t, rt.sent, 2, "no attempt after the changed one")
	assert.Equal(t, `{"amount":1000}`, rt.sent[0].body)
	for _, s := range rt.sent {
		if s.body != `{"amount":1000}` {
			assert.NotEqual(t, `{"amount":9999}`, s.body, "the other payload is never sent whole under the key")
		}
	}
	op, err := store.Get(context.Background(), ie.Key)
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, op.State)
}

// TestLargeBodySameBytesAcrossAttempts: the check passes for a GetBody
// that keeps its bytes, on every attempt.
func TestLargeBodySameBytesAcrossAttempts(t *testing.T) {
	rt := &scriptRT{steps: []step{resp(503), resp(503), resp(201)}}
	c, _ := newTestClient(rt, idem.WithMaxBodyBytes(8), idem.WithUnjournaledLargeBodies(),
		idem.WithBackoff(time.Millisecond, time.Millisecond))
	defer c.Close()
	r, err := post(t, context.Background(), c.HTTPClient(), `{"amount":1000}`)
	require.NoError(t, err)
	r.Body.Close()
	assert.Equal(t, 201, r.StatusCode)
	require.Len(t, rt.sent, 3)
	assert.False(t, errors.Is(err, idem.ErrBodyChanged))
}

// TestLargeBodyChangedOverTheWire: the same over a loopback server that
// reads each body whole: it never gets the other payload.
func TestLargeBodyChangedOverTheWire(t *testing.T) {
	var (
		mu     sync.Mutex
		bodies []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return // a cut body: nothing performed
		}
		mu.Lock()
		bodies = append(bodies, string(b))
		n := len(bodies)
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	c := idem.New(idem.NewMemoryStore(), idem.WithBaseTransport(srv.Client().Transport), idem.WithMaxBodyBytes(8),
		idem.WithUnjournaledLargeBodies(), idem.WithBackoff(time.Millisecond, time.Millisecond))
	defer c.Close()
	var calls atomic.Int32
	body := func() string {
		if calls.Add(1) >= 4 { // the request's own body, the fingerprint's pass, the first attempt; then the retry
			return `{"amount":9999}`
		}
		return `{"amount":1000}`
	}
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(body()))
	require.NoError(t, err)
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body())), nil }
	_, err = c.HTTPClient().Do(req)
	require.ErrorIs(t, err, idem.ErrBodyChanged)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{`{"amount":1000}`}, bodies, "the server read one whole body: the first payload")
}
