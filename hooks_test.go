package idem_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/replaytest"
)

// attemptLog keeps the AttemptDone events of a Client.
type attemptLog struct {
	mu  sync.Mutex
	got []idem.AttemptInfo
}

func (l *attemptLog) hooks() *idem.Hooks {
	return &idem.Hooks{AttemptDone: func(a idem.AttemptInfo) {
		l.mu.Lock()
		l.got = append(l.got, a)
		l.mu.Unlock()
	}}
}

func (l *attemptLog) events() []idem.AttemptInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]idem.AttemptInfo(nil), l.got...)
}

// TestAttemptDonePerRequestWritten sends keyed POSTs one after another to a
// server that drops every reused connection after reading its request, so
// net/http writes each request after the first twice on its own. Every
// request the server read must show as one AttemptDone, numbered within
// its call, and the journal must count the same.
func TestAttemptDonePerRequestWritten(t *testing.T) {
	srv, err := replaytest.New()
	require.NoError(t, err)
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	log := &attemptLog{}
	store := idem.NewMemoryStore()
	c := idem.New(store, idem.WithBaseTransport(base), idem.WithMaxAttempts(1), idem.WithHooks(log.hooks()))
	defer c.Close()

	const calls = 3
	keys := make([]string, calls)
	for i := range calls {
		ctx := idem.WithOperation(context.Background(), "pay:"+string(rune('a'+i)))
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay", strings.NewReader(`{"amount":1}`))
		require.NoError(t, err)
		resp, err := c.HTTPClient().Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		keys[i] = req.Header.Get("Idempotency-Key")
	}

	require.Equal(t, 2*calls-1, srv.Requests(), "the server's request count (the test's premise)")
	events := log.events()
	assert.Len(t, events, srv.Requests(), "AttemptDone events")
	journaled := 0
	perKey := map[string][]idem.AttemptInfo{}
	for _, a := range events {
		perKey[a.Key] = append(perKey[a.Key], a)
	}
	for key, evs := range perKey {
		op, err := store.Get(context.Background(), key)
		require.NoError(t, err)
		journaled += op.Attempts
		assert.Len(t, evs, op.Attempts, "AttemptDone events of %s", op.Name)
		for i, a := range evs {
			assert.Equal(t, i+1, a.Attempt, "attempt number of %s", op.Name)
			last := i == len(evs)-1
			assert.Equal(t, last, a.Status == http.StatusOK, "status of %s attempt %d: %d", op.Name, a.Attempt, a.Status)
			assert.Equal(t, last, a.Err == nil, "error of %s attempt %d: %v", op.Name, a.Attempt, a.Err)
		}
	}
	assert.Equal(t, srv.Requests(), journaled, "requests the journal counted")
}
