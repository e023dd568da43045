package idemstatus_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemstatus"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// provider answers /ok with 201, /flaky with 503 on the first request of
// each key and 201 after, and /lost by cutting the connection (the client
// never learns the outcome).
func provider(t *testing.T) *httptest.Server {
	t.Helper()
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen[r.Header.Get(idem.DefaultHeader)]++
		n := seen[r.Header.Get(idem.DefaultHeader)]
		mu.Unlock()
		switch r.URL.Path {
		case "/flaky":
			if n == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
		case "/lost":
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// newClient returns a Client on a memory store that feeds col, with fast
// retries and no keep-alives (so a cut connection is an error net/http
// does not replay).
func newClient(t *testing.T, col *idemstatus.Collector) (*idem.Client, *idem.MemoryStore) {
	t.Helper()
	store := idem.NewMemoryStore()
	c := idem.New(store,
		idem.WithHooks(col.Hooks()),
		idem.WithMaxAttempts(2),
		idem.WithBackoff(time.Millisecond, time.Millisecond),
		idem.WithBaseTransport(&http.Transport{DisableKeepAlives: true}))
	t.Cleanup(func() { _ = c.Close() })
	return c, store
}

// post sends a named POST and reads the answer to the end.
func post(t *testing.T, c *idem.Client, url, name string) error {
	t.Helper()
	ctx := idem.WithOperation(context.Background(), name)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"?token=secret", strings.NewReader(`{"amount":1}`))
	require.NoError(t, err)
	resp, err := c.HTTPClient().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.ReadAll(resp.Body)
	return err
}

func TestCollectorCountsEvents(t *testing.T) {
	srv := provider(t)
	col := idemstatus.NewCollector(0)
	c, _ := newClient(t, col)

	require.NoError(t, post(t, c, srv.URL+"/ok", "ok"))
	require.NoError(t, post(t, c, srv.URL+"/flaky", "flaky"))
	err := post(t, c, srv.URL+"/lost", "lost")
	require.ErrorIs(t, err, idem.ErrAttemptsExhausted)

	got := col.Counts()
	assert.Equal(t, int64(2), got.Attempts["201"], "attempts by reason: %v", got.Attempts)
	assert.Equal(t, int64(1), got.Attempts["503"], "attempts by reason: %v", got.Attempts)
	assert.Equal(t, int64(2), got.Attempts["connection closed"], "attempts by reason: %v", got.Attempts)
	assert.Equal(t, map[string]int64{"503": 1, "connection closed": 1}, got.Retries)
	assert.Equal(t, map[string]int64{"succeeded": 2}, got.Settled)
	assert.Equal(t, int64(1), got.InDoubt)
	assert.Zero(t, got.Resumed)
	assert.Zero(t, got.Expired)

	recent := col.Recent()
	require.Len(t, recent, 3)
	assert.Equal(t, []string{"in doubt", "settled", "settled"}, []string{recent[0].Kind, recent[1].Kind, recent[2].Kind}, "newest first")
	assert.Equal(t, "lost", recent[0].Name)
	assert.Equal(t, "pending", recent[0].State)
	assert.Contains(t, recent[0].Err, "EOF", "the last error")
	assert.Equal(t, srv.URL+"/lost", recent[0].URL, "no query in the URL")
}

func TestCollectorRecentIsARing(t *testing.T) {
	srv := provider(t)
	col := idemstatus.NewCollector(2)
	c, _ := newClient(t, col)
	for _, name := range []string{"a", "b", "c"} {
		require.NoError(t, post(t, c, srv.URL+"/ok", name))
	}
	var names []string
	for _, e := range col.Recent() {
		names = append(names, e.Name)
	}
	assert.Equal(t, []string{"c", "b"}, names)
}

func TestCollectorCountsResumeAndExpiry(t *testing.T) {
	srv := provider(t)
	col := idemstatus.NewCollector(0)
	store := idem.NewMemoryStore()
	// An operation journaled a day ago and never finished: past the
	// resend window, Resume expires it without sending.
	old := time.Now().Add(-24 * time.Hour)
	_, _, err := store.Reserve(context.Background(), idem.Operation{
		Key: "0190a0b0-0000-7000-8000-000000000001", Name: "old", Method: http.MethodPost, URL: srv.URL + "/ok",
		State: idem.StatePending, Created: old, Updated: old, Body: []byte(`{}`),
	})
	require.NoError(t, err)
	// A recent one that Resume sends again.
	_, _, err = store.Reserve(context.Background(), idem.Operation{
		Key: "0190a0b0-0000-7000-8000-000000000002", KeyHeader: idem.DefaultHeader, Name: "recent", Method: http.MethodPost, URL: srv.URL + "/ok",
		State: idem.StatePending, Created: time.Now(), Updated: time.Now(), Body: []byte(`{}`),
	})
	require.NoError(t, err)
	c := idem.New(store, idem.WithHooks(col.Hooks()))
	defer c.Close()
	require.NoError(t, c.Resume(context.Background(), func(op idem.Operation, resp *http.Response, err error) {
		if resp != nil {
			resp.Body.Close()
		}
	}))
	got := col.Counts()
	assert.Equal(t, int64(1), got.Expired)
	assert.Equal(t, int64(1), got.Resumed)
	kinds := map[string]string{}
	for _, e := range col.Recent() {
		kinds[e.Name] += e.Kind + ";"
	}
	assert.Equal(t, "expired;", kinds["old"])
	assert.Contains(t, kinds["recent"], "resumed;")
}

// status fetches the page as JSON through h.
func status(t *testing.T, h http.Handler, target string, header http.Header) idemstatus.Status {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, target, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	var st idemstatus.Status
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &st), rec.Body.String())
	return st
}

func TestHandlerJSON(t *testing.T) {
	srv := provider(t)
	col := idemstatus.NewCollector(0)
	c, store := newClient(t, col)
	require.NoError(t, post(t, c, srv.URL+"/ok", "ok"))
	require.Error(t, post(t, c, srv.URL+"/lost", "lost"))
	h := idemstatus.Handler(store, col)

	for name, tc := range map[string]struct {
		target string
		header http.Header
	}{
		"format parameter": {"/debug/idem?format=json", nil},
		"accept header":    {"/debug/idem", http.Header{"Accept": {"application/json"}}},
	} {
		t.Run(name, func(t *testing.T) {
			st := status(t, h, tc.target, tc.header)
			require.Empty(t, st.Error)
			require.NotNil(t, st.Pending)
			assert.Equal(t, 1, st.Pending.Count)
			assert.Equal(t, 1, st.Pending.InDoubt)
			assert.Zero(t, st.Pending.InFlight)
			require.NotNil(t, st.Pending.OldestInDoubt)
			assert.GreaterOrEqual(t, st.Pending.OldestInDoubtAge, 0.0)
			require.Len(t, st.Pending.Operations, 1)
			op := st.Pending.Operations[0]
			assert.Equal(t, "lost", op.Name)
			assert.Equal(t, http.MethodPost, op.Method)
			assert.Equal(t, srv.URL+"/lost", op.URL)
			assert.Equal(t, 2, op.Attempts)
			assert.False(t, op.InFlight)
			require.NotNil(t, st.Counts)
			assert.Equal(t, int64(1), st.Counts.InDoubt)
			assert.Equal(t, int64(1), st.Counts.Settled["succeeded"])
			assert.Len(t, st.Recent, 2)
		})
	}

	t.Run("limit", func(t *testing.T) {
		st := status(t, h, "/?format=json&limit=0", nil)
		assert.Equal(t, 1, st.Pending.Count, "counts cover every pending operation")
		assert.Empty(t, st.Pending.Operations)
	})
}

func TestHandlerHTMLEscapes(t *testing.T) {
	srv := provider(t)
	col := idemstatus.NewCollector(0)
	c, store := newClient(t, col)
	evil := `<script>alert("x")</script>`
	require.Error(t, post(t, c, srv.URL+"/lost", evil))

	req := httptest.NewRequest(http.MethodGet, "/debug/idem", nil)
	req.Header.Set("Accept", "text/html,application/xhtml+xml,application/json;q=0.9")
	rec := httptest.NewRecorder()
	idemstatus.Handler(store, col).ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"))
	body := rec.Body.String()
	assert.NotContains(t, body, evil)
	assert.Contains(t, body, "&lt;script&gt;")
	assert.Contains(t, body, "Pending: 1")
	assert.Contains(t, body, "in doubt")
	assert.Contains(t, body, `<table id="counters">`)
	assert.NotContains(t, body, "token=secret", "no query")
	assert.NotContains(t, body, `{"amount":1}`, "no body")
}

func TestHandlerWithoutJournalOrCollector(t *testing.T) {
	st := status(t, idemstatus.Handler(nil, nil), "/?format=json", nil)
	assert.Nil(t, st.Pending)
	assert.Nil(t, st.Counts)
}

func TestHandlerReportsJournalErrors(t *testing.T) {
	store := idem.NewMemoryStore()
	require.NoError(t, store.Close())
	st := status(t, idemstatus.Handler(store, nil), "/?format=json", nil)
	assert.Contains(t, st.Error, "closed")
	require.NotNil(t, st.Pending)
	assert.Zero(t, st.Pending.Count)
}

func TestHandlerRefusesOtherMethodsAndBadLimits(t *testing.T) {
	h := idemstatus.Handler(idem.NewMemoryStore(), nil)
	for _, tc := range []struct {
		method, target string
		want           int
	}{
		{http.MethodPost, "/", http.StatusMethodNotAllowed},
		{http.MethodGet, "/?limit=x", http.StatusBadRequest},
		{http.MethodGet, "/?limit=-1", http.StatusBadRequest},
		{http.MethodHead, "/", http.StatusOK},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.target, nil))
		assert.Equal(t, tc.want, rec.Code, "%s %s", tc.method, tc.target)
	}
}

// Compile-time check that every KeyStore is a Journal.
var _ idemstatus.Journal = idem.KeyStore(nil)

// TestRecentErrorsAreRedacted is finding 4 of issue 35 for the live page:
// an event's error text, which may quote the request's URL as sent (a
// *url.Error), shows it without its secret query parameters.
func TestRecentErrorsAreRedacted(t *testing.T) {
	col := idemstatus.NewCollector(0)
	err := &url.Error{Op: "Post", URL: "https://pay.example/x?X-Amz-Signature=s3cr3t&order=1", Err: errors.New("EOF")}
	col.Hooks().InDoubt(idem.OperationInfo{Key: "k", Method: "POST", URL: "https://pay.example/x?order=1", State: idem.StatePending}, err)
	recent := col.Recent()
	require.Len(t, recent, 1)
	assert.NotContains(t, recent[0].Err, "s3cr3t")
	assert.Contains(t, recent[0].Err, "order=1")
}
