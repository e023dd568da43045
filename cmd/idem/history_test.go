package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// TestShowHistory journals operations that retried through a real Client:
// "pay:flaky" got a 503, then its connection cut, and is left in doubt;
// "pay:late" got a 503, then a 201. show prints each one's attempts, in
// the table and in --json.
func TestShowHistory(t *testing.T) {
	var flaky, late atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := &flaky
		if r.URL.Path == "/late" {
			n = &late
		}
		switch n.Add(1) {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			if r.URL.Path == "/late" {
				w.WriteHeader(http.StatusCreated)
				return
			}
			panic(http.ErrAbortHandler)
		}
	}))
	t.Cleanup(srv.Close)
	path := filepath.Join(t.TempDir(), "journal.db")
	c, err := idem.Open(path, idem.WithMaxAttempts(2), idem.WithBackoff(time.Millisecond, time.Millisecond),
		idem.WithBaseTransport(&http.Transport{DisableKeepAlives: true}))
	require.NoError(t, err)
	for name, p := range map[string]string{"pay:flaky": "/flaky", "pay:late": "/late"} {
		req, err := http.NewRequestWithContext(idem.WithOperation(context.Background(), name), http.MethodPost,
			srv.URL+p+"?token=sk_secret", strings.NewReader(`{"amount":1}`))
		require.NoError(t, err)
		resp, err := c.HTTPClient().Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	require.NoError(t, c.Close())

	t.Run("in doubt", func(t *testing.T) {
		r := runIdem(t, "--journal", path, "show", "pay:flaky")
		require.Equal(t, exitOK, r.code, r.stderr)
		lines := historyLines(r.stdout)
		require.Len(t, lines, 2, r.stdout)
		assert.Regexp(t, `^  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\S*\s+sent 1\s+status 503\s+reason 503$`, lines[0])
		// The cut request was counted when it started, by the mark of the
		// 503 before it: its own mark adds nothing (idem.Attempt.Sent).
		assert.Regexp(t, `^  \S+\s+sent 0\s+error .*EOF.*\s+reason connection closed$`, lines[1])
		assert.NotContains(t, r.stdout, "sk_secret")

		var v opView
		runJSON(t, &v, "--journal", path, "show", "pay:flaky")
		require.Len(t, v.History, 2)
		assert.Equal(t, attemptView{At: v.History[0].At, Sent: 1, Status: 503, Reason: "503"}, v.History[0])
		assert.Equal(t, "connection closed", v.History[1].Reason)
		assert.Contains(t, v.History[1].Error, "EOF")
		assert.False(t, v.History[1].At.Before(v.History[0].At))
		assert.Equal(t, "pending", v.State)
	})
	t.Run("finished keeps its retries", func(t *testing.T) {
		r := runIdem(t, "--journal", path, "show", "pay:late")
		require.Equal(t, exitOK, r.code, r.stderr)
		assert.Contains(t, r.stdout, "succeeded")
		lines := historyLines(r.stdout)
		require.Len(t, lines, 1, r.stdout)
		assert.Regexp(t, `sent 1\s+status 503\s+reason 503$`, lines[0])
	})
}

// historyLines returns the lines of show's history section.
func historyLines(out string) []string {
	_, after, ok := strings.Cut(out, "\nhistory (")
	if !ok {
		return nil
	}
	var lines []string
	for _, l := range strings.Split(after, "\n")[1:] {
		if !regexp.MustCompile(`^  \S`).MatchString(l) {
			break
		}
		lines = append(lines, l)
	}
	return lines
}
