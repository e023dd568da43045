package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// recorder is a provider that records each request's headers and answers
// 201, except that it cuts the connection on paths starting with /lost
// until healed is set.
type recorder struct {
	*httptest.Server
	healed atomic.Bool
	mu     sync.Mutex
	seen   []http.Header
}

func newRecorder(t *testing.T) *recorder {
	rec := &recorder{}
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		rec.mu.Lock()
		rec.seen = append(rec.seen, r.Header.Clone())
		rec.mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/lost") && !rec.healed.Load() {
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(rec.Close)
	return rec
}

// requests returns the headers of every request so far.
func (r *recorder) requests() []http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]http.Header(nil), r.seen...)
}

// sentWith returns the requests whose header name carried value.
func (r *recorder) sentWith(name, value string) []http.Header {
	var out []http.Header
	for _, h := range r.requests() {
		if h.Get(name) == value {
			out = append(out, h)
		}
	}
	return out
}

// forge makes a journal by hand: the policy p, and ops as given (times
// included), finished ones finished at their Updated.
func forge(t *testing.T, p idem.Policy, ops ...idem.Operation) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "journal.db")
	s, err := idem.OpenBoltStore(path, nil)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, s.SetPolicy(ctx, p))
	for _, op := range ops {
		state := op.State
		op.State = idem.StatePending
		_, created, err := s.Reserve(ctx, op)
		require.NoError(t, err)
		require.True(t, created)
		if state.Finished() {
			require.NoError(t, s.Finish(ctx, op.Key, idem.Outcome{State: state, Status: 201, Sent: 1, At: op.Updated}))
		}
	}
	require.NoError(t, s.Close())
	return path
}

func forgedOp(key, name, url string, created time.Time) idem.Operation {
	return idem.Operation{
		Key: key, Name: name, Method: http.MethodPost, URL: url, State: idem.StatePending,
		Created: created, Updated: created, Attempts: 1, Fingerprint: [32]byte{1},
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"amount":4200}`),
	}
}

func TestResumeSendsUnderTheApplicationsKeyHeader(t *testing.T) {
	p := newProvider(t)
	path := filepath.Join(t.TempDir(), "journal.db")
	c, err := idem.Open(path, idem.WithKeyHeader("PayPal-Request-Id"), idem.WithMaxAttempts(1),
		idem.WithBaseTransport(&http.Transport{DisableKeepAlives: true}))
	require.NoError(t, err)
	ctx := idem.WithOperation(context.Background(), "pay:1")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/lost", strings.NewReader(`{"amount":1}`))
	require.NoError(t, err)
	_, err = c.HTTPClient().Do(req)
	require.Error(t, err, "the connection was cut: in doubt")
	require.NoError(t, c.Close())

	rec := newRecorder(t)
	s, err := idem.OpenBoltStore(path, nil)
	require.NoError(t, err)
	op, err := s.Named(context.Background(), "pay:1")
	require.NoError(t, err)
	require.NoError(t, s.Close())
	// Point the operation at the recorder: forge a copy under the same key.
	op.URL = rec.URL + "/v1/payments"
	pol := idem.Policy{KeyHeader: "Paypal-Request-Id", ResendWindow: idem.DefaultResendWindow, Retention: idem.DefaultRetention}
	path = forge(t, pol, op)

	r := runIdem(t, "--journal", path, "resume")
	require.Equal(t, exitOK, r.code, r.stdout+r.stderr)
	seen := rec.requests()
	require.Len(t, seen, 1)
	assert.Equal(t, op.Key, seen[0].Get("PayPal-Request-Id"), "the key travels in the application's header")
	assert.Empty(t, seen[0].Get("Idempotency-Key"))
}

func TestResumeActsUnderTheJournalsWindowAndRetention(t *testing.T) {
	rec := newRecorder(t)
	now := time.Now()
	t.Run("past a short window: expired, not sent", func(t *testing.T) {
		path := forge(t, idem.Policy{ResendWindow: time.Hour, Retention: 2 * time.Hour},
			forgedOp("k-old", "pay:old", rec.URL+"/v1/charges", now.Add(-2*time.Hour)))
		var got struct {
			Operations []resumeResult
			Summary    resumeSummary
		}
		runJSON(t, &got, "--journal", path, "resume")
		assert.Equal(t, resumeSummary{Expired: 1}, got.Summary)
		assert.Empty(t, rec.requests(), "nothing sent past the application's window")
	})
	t.Run("within a long window: sent, and nothing swept", func(t *testing.T) {
		done := forgedOp("k-done", "pay:yesterday", rec.URL+"/v1/charges", now.Add(-30*time.Hour))
		done.State = idem.StateSucceeded
		path := forge(t, idem.Policy{ResendWindow: 47 * time.Hour, Retention: 48 * time.Hour},
			done, forgedOp("k-doubt", "pay:doubt", rec.URL+"/v1/charges", now.Add(-30*time.Hour)))
		var got struct {
			Operations []resumeResult
			Summary    resumeSummary
		}
		runJSON(t, &got, "--journal", path, "resume")
		assert.Equal(t, resumeSummary{Sent: 1, Succeeded: 1}, got.Summary, "a 30 h old operation is within the 47 h window")
		require.Len(t, rec.requests(), 1)
		var v opView
		runJSON(t, &v, "--journal", path, "show", "pay:yesterday")
		assert.Equal(t, "k-done", v.Key, "resume swept nothing: the name keeps its key")
		r := runIdem(t, "--journal", path, "resume", "--resend-window", "72h")
		assert.Equal(t, exitUsage, r.code, "a flag may only be stricter")
		assert.Contains(t, r.stderr, "may only be shorter")
	})
}

func TestExpireIsFinal(t *testing.T) {
	j := newJournal(t)
	j.p.healed.Store(true)
	r := runIdem(t, "--journal", j.path, "expire", "pay:lost")
	require.Equal(t, exitOK, r.code, r.stderr)

	c, err := idem.Open(j.path, idem.WithBaseTransport(&http.Transport{DisableKeepAlives: true}))
	require.NoError(t, err)
	defer c.Close()
	for name, ctx := range map[string]context.Context{
		"by name": idem.WithOperation(context.Background(), "pay:lost"),
		"by key":  idem.WithKey(context.Background(), j.keys["pay:lost"]),
	} {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, j.p.URL+"/lost", strings.NewReader(`{"amount":4200,"card":"tok_visa"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		_, err = c.HTTPClient().Do(req)
		require.ErrorIs(t, err, idem.ErrExpired, name)
		// Expired by the operator minutes after its creation: not "past
		// the resend window", as ErrExpired's text said.
		assert.NotContains(t, err.Error(), "past the resend window", name)
	}
}

func TestTablesQuoteWhatCouldForgeThem(t *testing.T) {
	rec := newRecorder(t)
	evil := "pay:1\n01a2-forged-row  pay:ok  succeeded\x1b[2J"
	path := forge(t, idem.Policy{},
		forgedOp("k-evil", evil, rec.URL+"/v1/charges?x=\x1b]0;title\x07", time.Now()))
	for _, cmd := range []string{"ls", "pending"} {
		r := runIdem(t, "--journal", path, cmd)
		require.Equal(t, exitOK, r.code, r.stderr)
		assert.NotContains(t, r.stdout, "\x1b", "%s: no raw escape sequences", cmd)
		assert.Contains(t, r.stdout, `"pay:1\n01a2-forged-row  pay:ok  succeeded\x1b[2J"`, cmd)
		assert.Equal(t, 3, strings.Count(r.stdout, "\n"), "%s: a header, one row, a summary:\n%s", cmd, r.stdout)
	}
	r := runIdem(t, "--journal", path, "show", "k-evil")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.NotContains(t, r.stdout, "\x1b")
	var v opView
	runJSON(t, &v, "--journal", path, "show", "k-evil")
	assert.Equal(t, evil, v.Name, "--json is unchanged")
}

// TestTablesShortenHugeCells: a name (up to 1024 bytes) or URL that long
// is shortened in the tables of ls and pending, saying its length, so that
// one operation does not push every other row off the screen; show and
// --json keep it whole.
func TestTablesShortenHugeCells(t *testing.T) {
	rec := newRecorder(t)
	huge := "pay:" + strings.Repeat("n", 1020)
	path := forge(t, idem.Policy{},
		forgedOp("k-huge", huge, rec.URL+"/v1/charges", time.Now()),
		forgedOp("k-small", "pay:small", rec.URL+"/v1/charges", time.Now()))
	for _, cmd := range []string{"ls", "pending"} {
		r := runIdem(t, "--journal", path, cmd)
		require.Equal(t, exitOK, r.code, r.stderr)
		for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			assert.Less(t, len(line), 300, "%s: a line of %d bytes:\n%s", cmd, len(line), line)
		}
		assert.Contains(t, r.stdout, "(1024 bytes)", cmd)
	}
	r := runIdem(t, "--journal", path, "show", "k-huge")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, huge, "show prints the name whole")
	var v opView
	runJSON(t, &v, "--journal", path, "show", "k-huge")
	assert.Equal(t, huge, v.Name, "--json is unchanged")
}

func TestGCDryRun(t *testing.T) {
	old := forgedOp("k-old", "pay:old", "https://api.example.com/v1/charges", time.Now().Add(-30*time.Hour))
	old.State = idem.StateSucceeded
	path := forge(t, idem.Policy{ResendWindow: 23 * time.Hour, Retention: 25 * time.Hour}, old)
	var got struct {
		WouldSweep int `json:"would_sweep"`
		Operations []opView
	}
	runJSON(t, &got, "--journal", path, "gc", "--dry-run")
	assert.Equal(t, 1, got.WouldSweep)
	require.Len(t, got.Operations, 1)
	assert.Equal(t, "k-old", got.Operations[0].Key)
	var v opView
	runJSON(t, &v, "--journal", path, "show", "k-old")
	assert.Equal(t, "succeeded", v.State, "a dry run deletes nothing")
	var swept struct{ Swept int }
	runJSON(t, &swept, "--journal", path, "gc")
	assert.Equal(t, 1, swept.Swept)
}
