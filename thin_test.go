package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// thinSpy is a memory store that checks what the journal passes it: the
// store contract leaves every rule about a record to the journal, so every
// record it reserves must be valid and complete, and every outcome final,
// with the URL the finished record keeps.
type thinSpy struct {
	*idem.MemoryStore
	mu       sync.Mutex
	reserves int
	finishes map[string]idem.Outcome
	bad      []string
}

func newThinSpy() *thinSpy {
	return &thinSpy{MemoryStore: idem.NewMemoryStore(), finishes: map[string]idem.Outcome{}}
}

func (s *thinSpy) fault(format string, args ...any) {
	s.mu.Lock()
	s.bad = append(s.bad, fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

func (s *thinSpy) Reserve(ctx context.Context, op idem.Operation) (idem.Operation, bool, error) {
	s.mu.Lock()
	s.reserves++
	s.mu.Unlock()
	if err := idem.CheckKey(op.Key); err != nil {
		s.fault("Reserve got key %q: %v", op.Key, err)
	}
	if op.State != idem.StatePending || op.Created.IsZero() || op.Updated.IsZero() || op.Owner == "" || op.LeaseUntil.IsZero() {
		s.fault("Reserve got an incomplete record: %+v", op)
	}
	return s.MemoryStore.Reserve(ctx, op)
}

func (s *thinSpy) Attempt(ctx context.Context, key string, a idem.Attempt) error {
	if a.Sent < 0 || a.At.IsZero() || !recordable(a.Err) {
		s.fault("Attempt(%s) got %+v", key, a)
	}
	// The mark carries the journal's owner, the record's holder: the store
	// fences it by that (KeyStore.Attempt).
	if rec, err := s.MemoryStore.Get(ctx, key); err == nil && (a.Owner == "" || a.Owner != rec.Owner || rec.State != idem.StatePending) {
		s.fault("Attempt(%s) for owner %q of a %s record held by %q", key, a.Owner, rec.State, rec.Owner)
	}
	return s.MemoryStore.Attempt(ctx, key, a)
}

func (s *thinSpy) Finish(ctx context.Context, key string, o idem.Outcome) error {
	rec, err := s.MemoryStore.Get(ctx, key)
	switch {
	case err != nil:
		s.fault("Finish(%s) of no record: %v", key, err)
	case rec.State != idem.StatePending:
		s.fault("Finish(%s) of a %s record", key, rec.State)
	case !o.State.Finished() || o.Sent < -1 || rec.Attempts+o.Sent < 0 || o.At.IsZero() || !recordable(o.Err):
		// -1 withdraws a start the journal counted (Outcome.Sent).
		s.fault("Finish(%s) got %+v", key, o)
	case o.Owner == "" || o.Owner != rec.Owner:
		s.fault("Finish(%s) for owner %q of a record held by %q", key, o.Owner, rec.Owner)
	case o.URL != idem.TrimQuery(rec.URL) || o.URL == "":
		s.fault("Finish(%s) got URL %q for a record of %q", key, o.URL, rec.URL)
	}
	s.mu.Lock()
	s.finishes[key] = o
	s.mu.Unlock()
	return s.MemoryStore.Finish(ctx, key, o)
}

// recordable reports whether s is error text as the journal passes it:
// valid UTF-8 without NUL, at most 2 KiB.
func recordable(s string) bool {
	return len(s) <= 2048 && utf8.ValidString(s) && !strings.Contains(s, "\x00")
}

// TestJournalPassesThinStoreCalls drives a Client over the spy through a
// settled call, a refused one, one that fails unsent and one Resume
// finishes: the journal validates, completes and redacts, so the store has
// nothing to decide.
func TestJournalPassesThinStoreCalls(t *testing.T) {
	var fail sync.Map // paths that cut the connection
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if _, ok := fail.Load(r.URL.Path); ok { // no answer: the outcome is unknown
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	spy := newThinSpy()
	c := idem.New(spy, idem.WithMaxAttempts(1), idem.WithSecretQueryParams("card"))
	defer func() { require.NoError(t, c.Close()) }()
	hc := c.HTTPClient()
	post := func(ctx context.Context, url string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"amount":42}`))
		require.NoError(t, err)
		return hc.Do(req)
	}

	// A settled call: the finished record keeps neither query nor fragment.
	ctx := idem.WithKey(t.Context(), "key-settled")
	resp, err := post(ctx, srv.URL+"/pay?card=4242&ref=7#receipt")
	require.NoError(t, err)
	_, _ = io.ReadAll(resp.Body)
	require.NoError(t, resp.Body.Close())
	rec, err := spy.Get(t.Context(), "key-settled")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
	assert.Equal(t, srv.URL+"/pay", rec.URL, "the finished record's URL")

	// An invalid key never reaches the store.
	before := spy.reserves
	_, err = post(idem.WithKey(t.Context(), "not a key"), srv.URL+"/pay")
	require.ErrorIs(t, err, idem.ErrInvalidKey)
	assert.Equal(t, before, spy.reserves, "Reserve calls for an invalid key")

	// A call refused by a closed port was never sent: it fails unsent.
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	_, err = post(idem.WithKey(t.Context(), "key-unsent"), closed.URL+"/pay?ref=1")
	require.Error(t, err)
	if rec, err := spy.Get(t.Context(), "key-unsent"); err == nil {
		assert.Equal(t, closed.URL+"/pay", rec.URL, "the unsent record's URL")
	}

	// A call left in doubt (no answer), then finished by Resume.
	fail.Store("/doubt", true)
	_, err = post(idem.WithKey(t.Context(), "key-doubt"), srv.URL+"/doubt?ref=1#x")
	require.Error(t, err)
	fail.Delete("/doubt")
	rec, err = spy.Get(t.Context(), "key-doubt")
	require.NoError(t, err)
	require.Equal(t, idem.StatePending, rec.State, "a call without an answer is in doubt")
	resumed := 0
	require.NoError(t, c.Resume(t.Context(), func(op idem.Operation, resp *http.Response, err error) {
		resumed++
		if assert.NoError(t, err, op.Key) {
			_ = resp.Body.Close()
		}
	}))
	assert.Equal(t, 1, resumed)
	rec, err = spy.Get(t.Context(), "key-doubt")
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State)
	assert.Equal(t, srv.URL+"/doubt", rec.URL)

	spy.mu.Lock()
	defer spy.mu.Unlock()
	assert.Empty(t, spy.bad, "what the journal passed its store")
	if o, ok := spy.finishes["key-settled"]; assert.True(t, ok) {
		assert.Equal(t, srv.URL+"/pay", o.URL)
	}
}

// TestReopenedRecordKeepsItsURL settles a call with its last, transient
// answer, re-drives its key (Acquire reopens the finished record), leaves
// the re-drive in doubt and lets Resume send it: Resume must send the URL
// the call had, query included, not the one the finished record kept.
func TestReopenedRecordKeepsItsURL(t *testing.T) {
	var (
		mu   sync.Mutex
		mode = "500"
		seen []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen = append(seen, r.URL.RequestURI())
		m := mode
		mu.Unlock()
		switch m {
		case "500":
			w.WriteHeader(http.StatusInternalServerError)
		case "cut":
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = conn.Close()
			}
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}))
	defer srv.Close()
	setMode := func(m string) { mu.Lock(); mode = m; mu.Unlock() }
	spy := newThinSpy()
	c := idem.New(spy, idem.WithMaxAttempts(1))
	defer func() { require.NoError(t, c.Close()) }()
	call := func() error {
		req, err := http.NewRequestWithContext(idem.WithKey(t.Context(), "key-reopen"), http.MethodPost, srv.URL+"/pay?ref=42", strings.NewReader(`{"amount":42}`))
		require.NoError(t, err)
		resp, err := c.HTTPClient().Do(req)
		if err == nil {
			_, _ = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
		}
		return err
	}
	require.NoError(t, call()) // a 500, the last attempt: settled, failed
	rec, err := spy.Get(t.Context(), "key-reopen")
	require.NoError(t, err)
	require.Equal(t, idem.StateFailed, rec.State)
	require.Equal(t, srv.URL+"/pay", rec.URL, "a finished record keeps no query")

	setMode("cut")
	require.Error(t, call()) // the re-drive reopens it, and gets no answer
	rec, err = spy.Get(t.Context(), "key-reopen")
	require.NoError(t, err)
	require.Equal(t, idem.StatePending, rec.State)
	assert.Equal(t, srv.URL+"/pay?ref=42", rec.URL, "the reopened record's URL")

	setMode("ok")
	require.NoError(t, c.Resume(t.Context(), func(op idem.Operation, resp *http.Response, err error) {
		if assert.NoError(t, err, op.Key) {
			_ = resp.Body.Close()
		}
	}))
	rec, err = spy.Get(t.Context(), "key-reopen")
	require.NoError(t, err)
	require.Equal(t, idem.StateSucceeded, rec.State)

	// A Resume handler that read the answer and then panicked: Resume makes
	// the finished operation pending again, with its URL.
	setMode("cut")
	require.Error(t, call())
	setMode("ok")
	require.Error(t, c.Resume(t.Context(), func(op idem.Operation, resp *http.Response, err error) {
		require.NoError(t, err)
		_, _ = io.ReadAll(resp.Body)
		panic("handler bug")
	}))
	rec, err = spy.Get(t.Context(), "key-reopen")
	require.NoError(t, err)
	require.Equal(t, idem.StatePending, rec.State, "after the handler panicked")
	assert.Equal(t, srv.URL+"/pay?ref=42", rec.URL, "the URL after the handler panicked")

	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(seen), 5, "the calls, the re-drives and the Resumes")
	for i, uri := range seen { // net/http may have replayed the cut request
		assert.Equal(t, "/pay?ref=42", uri, "request %d the server received", i+1)
	}
}

// TestJournalCleansErrorText fails a call with an error whose text is
// long, not UTF-8 and has a NUL byte: the journal records it cleaned and
// bounded, the same for every store (pgstore alone used to clean it).
func TestJournalCleansErrorText(t *testing.T) {
	bad := "proxy said \xff\xfe\x00 Bad Gateway " + strings.Repeat("é", 10000)
	spy := newThinSpy()
	c := idem.New(spy, idem.WithMaxAttempts(1), idem.WithBaseTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		_, _ = io.Copy(io.Discard, r.Body)
		return nil, errors.New(bad) // after the request went out: in doubt
	})))
	defer func() { require.NoError(t, c.Close()) }()
	req, err := http.NewRequestWithContext(idem.WithKey(t.Context(), "key-text"), http.MethodPost, "https://pay.example/v1/charges", strings.NewReader("{}"))
	require.NoError(t, err)
	_, err = c.HTTPClient().Do(req)
	require.Error(t, err)
	rec, err := spy.Get(t.Context(), "key-text")
	require.NoError(t, err)
	assert.True(t, recordable(rec.LastError), "LastError of %d bytes: %.60q", len(rec.LastError), rec.LastError)
	assert.Contains(t, rec.LastError, "proxy said \uFFFD\uFFFD Bad Gateway")
	spy.mu.Lock()
	defer spy.mu.Unlock()
	assert.Empty(t, spy.bad, "what the journal passed its store")
}
