package idem_test

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
)

// TestStalledErrorBodyDoesNotHoldRoundTrip: a server sends an error's
// headers and the first chunk of its body, then stalls. RoundTrip returns
// while it stalls, with or without a provider profile (whose codes are
// read from the body), and the caller still reads the whole body once the
// server sends the rest.
func TestStalledErrorBodyDoesNotHoldRoundTrip(t *testing.T) {
	const (
		first = `{"error":{"type":"invalid_request_error",`
		rest  = `"code":"idempotency_key_in_use"}}`
	)
	for _, tc := range []struct {
		name   string
		status int
		opts   []idem.Option
	}{
		{"409 without a provider", http.StatusConflict, nil},
		{"409 with Stripe", http.StatusConflict, []idem.Option{idem.WithProvider(idem.Stripe)}},
		{"400 with Stripe", http.StatusBadRequest, []idem.Option{idem.WithProvider(idem.Stripe)}},
		{"409 with Amazon Pay", http.StatusConflict, []idem.Option{idem.WithProvider(idem.AmazonPay)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			var handlerDone atomic.Bool
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer handlerDone.Store(true)
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				io.WriteString(w, first)
				w.(http.Flusher).Flush()
				select { // stalls until the test lets it go, at most 20 s
				case <-release:
				case <-time.After(20 * time.Second):
				case <-r.Context().Done():
					return
				}
				io.WriteString(w, rest)
			}))
			defer srv.Close()
			c := idem.New(idem.NewMemoryStore(), append([]idem.Option{idem.WithMaxAttempts(1)}, tc.opts...)...)
			defer c.Close()
			req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL, strings.NewReader("{}"))
			require.NoError(t, err)
			resp, err := c.HTTPClient().Do(req)
			stalled := !handlerDone.Load()
			close(release)
			require.NoError(t, err)
			defer resp.Body.Close()
			assert.True(t, stalled, "RoundTrip returned only when the server stopped stalling")
			assert.Equal(t, tc.status, resp.StatusCode)
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, first+rest, string(b), "the caller reads the whole body, the peeked bytes included")
		})
	}
}
