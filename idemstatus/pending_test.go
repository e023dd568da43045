package idemstatus_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemstatus"
)

// fillPending journals n pending operations in doubt (lease lapsed), with
// keys in order, the first ones redacted (journaled without credentials).
func fillPending(t testing.TB, store idem.KeyStore, n, redacted int) []string {
	t.Helper()
	ctx := context.Background()
	past := time.Now().Add(-time.Hour)
	keys := make([]string, n)
	for i := range n {
		keys[i] = fmt.Sprintf("00000000-0000-7000-8000-%012d", i)
		_, created, err := store.Reserve(ctx, idem.Operation{
			Key: keys[i], Name: fmt.Sprintf("pay:order-%d", i), Method: http.MethodPost, URL: "https://psp.test/v1/charges",
			State: idem.StatePending, Created: past, Owner: "bff-1", LeaseUntil: past,
			Redacted: i < redacted, Attempts: 1, LastError: "unexpected EOF",
		})
		require.NoError(t, err)
		require.True(t, created)
	}
	return keys
}

// page fetches the HTML page at target from h.
func htmlPage(t *testing.T, h http.Handler, target string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	require.Equal(t, http.StatusOK, rec.Code)
	return rec.Body.String()
}

func TestHandlerTotalsAndPaging(t *testing.T) {
	store := idem.NewMemoryStore()
	defer store.Close()
	keys := fillPending(t, store, 250, 0)
	h := idemstatus.Handler(store, nil)

	st := status(t, h, "/?format=json", nil)
	require.NotNil(t, st.Pending)
	assert.Equal(t, 250, st.Pending.Count)
	assert.Len(t, st.Pending.Operations, idemstatus.DefaultLimit)
	assert.Equal(t, 0, st.Pending.Before)
	assert.True(t, st.Pending.More)
	assert.Equal(t, keys[99], st.Pending.Next)

	// Walk the pages by their cursors: every operation once, in order.
	var seen []string
	for after, pages := "", 0; pages < 10; pages++ {
		st := status(t, h, "/?format=json&limit=100&after="+after, nil)
		assert.Equal(t, 250, st.Pending.Count, "the total on every page")
		assert.Equal(t, len(seen), st.Pending.Before, "operations before the page")
		for _, op := range st.Pending.Operations {
			seen = append(seen, op.Key)
		}
		if st.Pending.Next == "" {
			assert.False(t, st.Pending.More)
			break
		}
		after = st.Pending.Next
	}
	assert.Equal(t, keys, seen)

	body := htmlPage(t, h, "/")
	assert.Contains(t, body, "Showing 1–100 of 250 pending operations")
	assert.Regexp(t, regexp.MustCompile(`<a id="next" href="\?after=`+regexp.QuoteMeta(keys[99])+`">next 100</a>`), body)
	body = htmlPage(t, h, "/?after="+keys[199])
	assert.Contains(t, body, "Showing 201–250 of 250 pending operations")
	assert.NotContains(t, body, `id="next"`, "no next link on the last page")
	assert.Contains(t, body, "first page")
}

func TestHandlerTotalsAtTenThousand(t *testing.T) {
	if testing.Short() {
		t.Skip("journals 10,000 operations")
	}
	store := idem.NewMemoryStore()
	defer store.Close()
	fillPending(t, store, 10_000, 0)
	body := htmlPage(t, idemstatus.Handler(store, nil), "/")
	assert.Contains(t, body, "Pending: 10,000")
	assert.Contains(t, body, "Showing 1–100 of 10,000 pending operations")
	assert.Equal(t, 100, strings.Count(body, "<tr><td>00000000-"), "one row per listed operation")
}

func TestHandlerSaysWhyAndWhatToDo(t *testing.T) {
	store := idem.NewMemoryStore()
	defer store.Close()
	fillPending(t, store, 2, 1) // the first journaled without credentials

	st := status(t, idemstatus.Handler(store, nil), "/?format=json", nil)
	ops := st.Pending.Operations
	require.Len(t, ops, 2)
	assert.True(t, ops[0].NeedsCredentials)
	assert.Contains(t, ops[0].Why, "without its credentials")
	assert.Contains(t, ops[0].Do, "WithResumePrepare")
	assert.False(t, ops[1].NeedsCredentials)
	assert.Contains(t, ops[1].Why, "the connection closed before an answer (unexpected EOF)")
	assert.Contains(t, ops[1].Do, "idem resume")
	body := htmlPage(t, idemstatus.Handler(store, nil), "/")
	assert.Equal(t, 1, strings.Count(body, "Needs credentials."), "only the operation the application cannot resend")

	// An application that adds credentials back on resume: none needs them.
	st = status(t, idemstatus.Handler(store, nil, idemstatus.WithResumePrepare()), "/?format=json", nil)
	for _, op := range st.Pending.Operations {
		assert.False(t, op.NeedsCredentials, "%s", op.Key)
		assert.NotEmpty(t, op.Why)
		assert.NotEmpty(t, op.Do)
	}
	assert.NotContains(t, htmlPage(t, idemstatus.Handler(store, nil, idemstatus.WithResumePrepare()), "/"), "Needs credentials.")
}

// TestHandlerShowsLiveAttempts holds an operation in flight after a retry
// (the journal has counted its first attempt and the one under way, the
// Collector the first) and one
// that failed: the page shows the attempts and the last status of each.
func TestHandlerShowsLiveAttempts(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 4)
	var calls int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		switch {
		case r.URL.Path == "/bad":
			w.WriteHeader(http.StatusUnprocessableEntity)
		case calls == 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			entered <- struct{}{}
			<-release
			w.WriteHeader(http.StatusCreated)
		}
	}))
	defer srv.Close()
	col := idemstatus.NewCollector(0)
	c, store := newClient(t, col)

	done := make(chan error, 1)
	go func() { done <- post(t, c, srv.URL+"/slow", "pay:slow") }()
	<-entered // the second request is at the server

	st := status(t, idemstatus.Handler(store, col), "/?format=json", nil)
	require.Len(t, st.Pending.Operations, 1)
	op := st.Pending.Operations[0]
	assert.True(t, op.InFlight)
	assert.Equal(t, 2, op.Attempts, "the attempt that got its answer and the one under way, counted when it started")
	assert.Equal(t, 503, op.LastStatus)
	assert.Contains(t, op.Why, "being sent now by")
	assert.Contains(t, op.Why, "attempt 2 under way (last: 503 Service Unavailable")
	live, ok := col.Live(op.Key)
	assert.True(t, ok)
	assert.Equal(t, idemstatus.LiveOp{Attempts: 1, Status: 503, Reason: "503"}, live)
	close(release)
	require.NoError(t, <-done)

	require.NoError(t, post(t, c, srv.URL+"/bad", "pay:bad"))
	recent := col.Recent()
	require.NotEmpty(t, recent)
	assert.Equal(t, "failed", recent[0].State)
	assert.Equal(t, http.StatusUnprocessableEntity, recent[0].Status, "a failed operation keeps its status")
}
