package pgstore_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
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

// TestHeaderColumnHoldsNoSecrets is finding 4 of issue 35 for PostgreSQL:
// a pending operation sent with X-Api-Key and the other default secret
// headers keeps its header in operations.header without them.
func TestHeaderColumnHoldsNoSecrets(t *testing.T) {
	s := openStore(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		panic(http.ErrAbortHandler) // no answer: the operation stays pending, its header kept
	}))
	defer srv.Close()
	c := idem.New(s, idem.WithMaxAttempts(1), idem.WithBaseTransport(&http.Transport{DisableKeepAlives: true}))
	defer c.Close()
	ctx := testContext(t)
	secrets := map[string]string{"X-Api-Key": "sk-ant-pg-1", "Api-Key": "pg-apikey-2", "X-Auth-Token": "pg-auth-3", "X-Amz-Security-Token": "pg-amz-4"}
	req, err := http.NewRequestWithContext(idem.WithKey(ctx, "k-secret"), http.MethodPost, srv.URL+"/pay", strings.NewReader("{}"))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range secrets {
		req.Header.Set(k, v)
	}
	_, err = c.HTTPClient().Do(req)
	require.Error(t, err)
	var header string
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT convert_from(header, 'UTF8') FROM `+pgx.Identifier{s.Schema(), "operations"}.Sanitize()+` WHERE key = $1`, "k-secret").Scan(&header))
	assert.Contains(t, header, "application/json", "the pending operation's header is kept")
	for _, v := range secrets {
		assert.NotContains(t, header, v)
	}
}
