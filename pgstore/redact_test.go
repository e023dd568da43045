package pgstore_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// TestFinishedURLIsTheJournals settles calls whose URLs have a fragment,
// with and without a query, through a Client over PostgreSQL: the finished
// record keeps the URL the journal computed, neither query nor fragment,
// as every other store does (pgstore once kept a fragment when the URL had
// no query).
func TestFinishedURLIsTheJournals(t *testing.T) {
	s := openStore(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	c := idem.New(s, quickRetries)
	defer c.Close()
	ctx := testContext(t)
	for key, path := range map[string]string{"k-frag": "/pay#receipt", "k-both": "/pay?ref=1#receipt"} {
		req, err := http.NewRequestWithContext(idem.WithKey(ctx, key), http.MethodPost, srv.URL+path, strings.NewReader("{}"))
		require.NoError(t, err)
		resp, err := c.HTTPClient().Do(req)
		require.NoError(t, err)
		_, _ = io.ReadAll(resp.Body)
		require.NoError(t, resp.Body.Close())
		rec, err := s.Get(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, idem.StateSucceeded, rec.State, key)
		assert.Equal(t, srv.URL+"/pay", rec.URL, key)
	}
}
