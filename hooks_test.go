package idem_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/logtest"
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

// okRT answers every request 201 with a small body.
type okRT struct{}

func (okRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("{}")), Request: r}, nil
}

// postNamed sends one named POST through c and reads the answer to the end.
func postNamed(t *testing.T, c *idem.Client, ctx context.Context, name string) error {
	t.Helper()
	req, err := http.NewRequestWithContext(idem.WithOperation(ctx, name), http.MethodPost, "http://provider.test/pay", strings.NewReader(`{}`))
	require.NoError(t, err)
	resp, err := c.HTTPClient().Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

func TestHooksCompose(t *testing.T) {
	var mu sync.Mutex
	var got []string
	named := func(name string) *idem.Hooks {
		return &idem.Hooks{
			AttemptDone: func(idem.AttemptInfo) { mu.Lock(); got = append(got, name+" attempt"); mu.Unlock() },
			Settled:     func(idem.OperationInfo) { mu.Lock(); got = append(got, name+" settled"); mu.Unlock() },
		}
	}
	c := idem.New(idem.NewMemoryStore(), idem.WithBaseTransport(okRT{}),
		idem.WithHooks(named("client 1")), idem.WithHooks(nil), idem.WithHooks(named("client 2")))
	defer c.Close()

	ctx := idem.WithRequestHooks(context.Background(), named("request 1"))
	ctx = idem.WithRequestHooks(ctx, nil)
	ctx = idem.WithRequestHooks(ctx, named("request 2"))
	require.NoError(t, postNamed(t, c, ctx, "pay:1"))
	assert.Equal(t, []string{
		"client 1 attempt", "client 2 attempt", "request 1 attempt", "request 2 attempt",
		"client 1 settled", "client 2 settled", "request 1 settled", "request 2 settled",
	}, got)

	// A context derived from the first one only has the first request hooks.
	got = nil
	require.NoError(t, postNamed(t, c, idem.WithRequestHooks(context.Background(), named("other")), "pay:2"))
	assert.Equal(t, []string{"client 1 attempt", "client 2 attempt", "other attempt", "client 1 settled", "client 2 settled", "other settled"}, got)
}

// failingStore is a MemoryStore whose Reserve or Finish fail on demand
// with an error matching ErrJournalWrite, as a full disk would.
type failingStore struct {
	*idem.MemoryStore
	reserve, finish bool
}

var errDiskFull = fmt.Errorf("%w: no space left on device", idem.ErrJournalWrite)

func (s *failingStore) Reserve(ctx context.Context, op idem.Operation) (idem.Operation, bool, error) {
	if s.reserve {
		return idem.Operation{}, false, errDiskFull
	}
	return s.MemoryStore.Reserve(ctx, op)
}

func (s *failingStore) Finish(ctx context.Context, key string, o idem.Outcome) error {
	if s.finish {
		return errDiskFull
	}
	return s.MemoryStore.Finish(ctx, key, o)
}

func TestJournalErrorHook(t *testing.T) {
	for _, tc := range []struct {
		name            string
		reserve, finish bool
		wantWrite       string
		wantCallErr     bool
		wantSettled     int
	}{
		{name: "reservation fails", reserve: true, wantWrite: idem.WriteReserve, wantCallErr: true},
		{name: "finish mark fails", finish: true, wantWrite: idem.WriteFinish},
		{name: "no failure", wantSettled: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &failingStore{MemoryStore: idem.NewMemoryStore(), reserve: tc.reserve, finish: tc.finish}
			var (
				mu       sync.Mutex
				failures []idem.JournalErrorInfo
				settled  int
			)
			logs := &logtest.Records{}
			c := idem.New(store, idem.WithBaseTransport(okRT{}), idem.WithLogger(slog.New(logs)), idem.WithHooks(&idem.Hooks{
				JournalError: func(e idem.JournalErrorInfo) { mu.Lock(); failures = append(failures, e); mu.Unlock() },
				Settled:      func(idem.OperationInfo) { mu.Lock(); settled++; mu.Unlock() },
			}))
			defer c.Close()

			err := postNamed(t, c, context.Background(), "pay:1")
			if tc.wantCallErr {
				require.ErrorIs(t, err, idem.ErrJournalWrite)
			} else {
				require.NoError(t, err)
			}
			mu.Lock()
			defer mu.Unlock()
			assert.Equal(t, tc.wantSettled, settled, "Settled calls")
			errorLines := 0
			for _, r := range logs.Find("idem: journal write failed") {
				if r.Level == slog.LevelError {
					errorLines++
				}
			}
			if tc.wantWrite == "" {
				assert.Empty(t, failures)
				assert.Zero(t, errorLines)
				return
			}
			require.Len(t, failures, 1)
			f := failures[0]
			assert.Equal(t, tc.wantWrite, f.Write)
			assert.Equal(t, "pay:1", f.Name)
			assert.ErrorIs(t, f.Err, idem.ErrJournalWrite)
			assert.Equal(t, 1, errorLines, "one Error line")
			if tc.finish {
				assert.NotEmpty(t, f.Key)
				op, err := store.Get(context.Background(), f.Key)
				require.NoError(t, err)
				assert.Equal(t, idem.StatePending, op.State, "the journal still holds it as pending")
			}
		})
	}
}

func TestNewNilStorePanicsWithAReason(t *testing.T) {
	var bolt *idem.BoltStore // what an unchecked OpenBoltStore error leaves
	for _, store := range []idem.KeyStore{nil, bolt} {
		assert.PanicsWithValue(t, fmt.Sprintf("idem.New: the KeyStore is nil (%T): check the error of the call that opened it (OpenBoltStore, pgstore.Open, ...) before calling New", store),
			func() { idem.New(store) })
	}
}
