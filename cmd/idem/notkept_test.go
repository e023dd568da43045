package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
)

// TestShowNotKept: an operation whose server performed it but could not
// keep its answer (the client got 409 ProblemNotKept on the retry) shows
// as performed with its original status, not as "failed 409".
func TestShowNotKept(t *testing.T) {
	var runs int
	h := idemserver.New(idemserver.NewMemoryStore(), idemserver.WithSingleTenant(), idemserver.WithMaxResponseBytes(16)).Required(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, strings.Repeat("charged ", 8)) // too large to keep
		}))
	path := filepath.Join(t.TempDir(), "journal.db")
	lost := false
	c, err := idem.Open(path, idem.WithBaseTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if !lost { // the first answer is lost on the way back
			lost = true
			return nil, io.ErrUnexpectedEOF
		}
		resp := w.Result()
		resp.Request = r
		return resp, nil
	})), idem.WithBackoff(0, 0))
	require.NoError(t, err)
	ctx := idem.WithOperation(context.Background(), "pay:notkept")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://pay.test/v1/charges", strings.NewReader(`{"amount":1}`))
	require.NoError(t, err)
	resp, err := c.HTTPClient().Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.NoError(t, c.Close())
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	require.Equal(t, 1, runs)

	r := runIdem(t, "--journal", path, "show", "pay:notkept")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Regexp(t, `state\s+succeeded`, r.stdout)
	assert.Regexp(t, `last status\s+201`, r.stdout)
	assert.Regexp(t, `note\s+performed by server, answer not kept \(original status 201\)\n`, r.stdout)
}

// roundTripFunc is a RoundTripper made of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
