package idemtest

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCheckSendStopsAtBound sends past MaxCheckRequests: no configuration
// of Check reaches the bound (TestCheckBoundsRequests sends fewer), so the
// bound is checked here, on the server's side too.
func TestCheckSendStopsAtBound(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	c, err := newChecker(CheckConfig{URL: srv.URL})
	require.NoError(t, err)
	for i := range MaxCheckRequests + 3 {
		a := c.send(context.Background(), c.newOp(`{}`), false)
		if i < MaxCheckRequests {
			require.NoError(t, a.err, "request %d", i)
		} else {
			require.ErrorIs(t, a.err, errBound, "request %d", i)
		}
	}
	assert.EqualValues(t, MaxCheckRequests, c.sent.Load(), "requests counted")
	assert.EqualValues(t, MaxCheckRequests, hits.Load(), "requests the server read")
}
