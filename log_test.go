package idem_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/logtest"
)

// logRT answers by path: /flaky gets a 503 on its first request and 201
// after, /lost never gets an answer.
type logRT struct {
	mu   sync.Mutex
	seen map[string]int
}

func (rt *logRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	rt.mu.Lock()
	rt.seen[r.URL.Path]++
	n := rt.seen[r.URL.Path]
	rt.mu.Unlock()
	status := http.StatusCreated
	switch {
	case r.URL.Path == "/lost":
		return nil, io.ErrUnexpectedEOF
	case r.URL.Path == "/flaky" && n == 1:
		status = http.StatusServiceUnavailable
	}
	return &http.Response{StatusCode: status, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("{}")), Request: r}, nil
}

// logCalls runs a retried call ("pay:flaky") and one left in doubt
// ("pay:lost") through a Client made with opts.
func logCalls(t *testing.T, opts ...idem.Option) {
	t.Helper()
	opts = append([]idem.Option{
		idem.WithBaseTransport(&logRT{seen: map[string]int{}}),
		idem.WithMaxAttempts(2),
		idem.WithBackoff(time.Millisecond, time.Millisecond),
	}, opts...)
	c := idem.New(idem.NewMemoryStore(), opts...)
	defer c.Close()
	callPaths(t, c)
}

// callPaths sends pay:flaky and pay:lost through c.
func callPaths(t *testing.T, c *idem.Client) {
	t.Helper()
	for _, path := range []string{"/flaky", "/lost"} {
		ctx := idem.WithOperation(context.Background(), "pay:"+path[1:])
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://provider.test"+path, strings.NewReader(`{"amount":1}`))
		require.NoError(t, err)
		resp, err := c.HTTPClient().Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
}

func TestLoggerRecordsRetriesAndDoubt(t *testing.T) {
	h := &logtest.Records{}
	logCalls(t, idem.WithLogger(slog.New(h)))

	retries := h.Find("idem: retrying")
	require.Len(t, retries, 2, "one Debug record per retry: pay:flaky once, pay:lost once")
	for _, r := range retries {
		assert.Equal(t, slog.LevelDebug, r.Level)
		assert.NotEmpty(t, r.Attrs["idem.key"].String())
		require.Contains(t, r.Attrs, "http.request.resend_count")
		assert.Equal(t, int64(1), r.Attrs["http.request.resend_count"].Int64(), "the first retry is resend 1")
		assert.NotEmpty(t, r.Attrs["idem.reason"].String())
		assert.LessOrEqual(t, r.Attrs["idem.retry.delay_ms"].Float64(), 1.0, "the delay in milliseconds, at most the 1 ms backoff")
		assert.Equal(t, "backoff", r.Attrs["idem.retry.delay_source"].String())
		assert.NotContains(t, r.Attrs, "idem.wait")
	}
	reasons := []string{retries[0].Attrs["idem.reason"].String(), retries[1].Attrs["idem.reason"].String()}
	assert.ElementsMatch(t, []string{"503", "connection closed"}, reasons)
	assert.ElementsMatch(t, []string{"pay:flaky", "pay:lost"}, []string{retries[0].Attrs["idem.operation"].String(), retries[1].Attrs["idem.operation"].String()})

	answered := h.Find("idem: answered after retries")
	require.Len(t, answered, 1, "one Info record for the call that needed a retry")
	assert.Equal(t, slog.LevelInfo, answered[0].Level)
	assert.Equal(t, "pay:flaky", answered[0].Attrs["idem.operation"].String())
	assert.Equal(t, int64(201), answered[0].Attrs["http.response.status_code"].Int64())
	assert.Equal(t, int64(2), answered[0].Attrs["idem.attempts"].Int64())
	assert.Contains(t, answered[0].Attrs, "idem.elapsed_ms")

	doubt := h.Find("idem: operation left in doubt")
	require.Len(t, doubt, 1)
	assert.Equal(t, slog.LevelWarn, doubt[0].Level)
	assert.Equal(t, "pay:lost", doubt[0].Attrs["idem.operation"].String())
	assert.NotEmpty(t, doubt[0].Attrs["idem.key"].String())
	assert.Equal(t, retries[1].Attrs["idem.key"].String(), doubt[0].Attrs["idem.key"].String(), "the retried key is the key left in doubt")
	assert.Contains(t, doubt[0].Attrs["exception.message"].String(), "unexpected EOF")

	for _, r := range h.All() {
		for k, v := range r.Attrs {
			assert.NotContains(t, v.String(), `"amount"`, "no body in %q of %q", k, r.Msg)
			assert.Contains(t, logStyle, k, "attribute %q of %q is in the one style", k, r.Msg)
			if v.Kind() == slog.KindDuration {
				t.Errorf("attribute %q of %q is a bare duration (nanoseconds in JSON)", k, r.Msg)
			}
		}
	}
}

// logStyle lists every attribute name idem's log records may carry: the
// OpenTelemetry names where they exist, idem.* otherwise, durations with
// their unit in the name.
var logStyle = map[string]bool{
	"idem.key": true, "idem.operation": true, "idem.reason": true, "idem.attempts": true, "idem.stop": true,
	"idem.retry.delay_ms": true, "idem.retry.delay_source": true, "idem.elapsed_ms": true, "idem.sent": true,
	"idem.journal.write": true, "idem.swept": true,
	"http.request.resend_count": true, "http.response.status_code": true, "exception.message": true,
}

func TestLoggerResumedOperations(t *testing.T) {
	h := &logtest.Records{}
	path := filepath.Join(t.TempDir(), "journal.db")
	first, err := idem.Open(path, idem.WithBaseTransport(&logRT{seen: map[string]int{}}),
		idem.WithMaxAttempts(2), idem.WithBackoff(time.Millisecond, time.Millisecond))
	require.NoError(t, err)
	callPaths(t, first)
	require.NoError(t, first.Close())
	c, err := idem.Open(path, idem.WithBaseTransport(&logRT{seen: map[string]int{}}), idem.WithMaxAttempts(1), idem.WithLogger(slog.New(h)))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Resume(context.Background(), func(_ idem.Operation, resp *http.Response, err error) {
		if resp != nil {
			resp.Body.Close()
		}
	}))
	took := h.Find("idem: resume took operation")
	require.Len(t, took, 1, "one Debug record per operation Resume took")
	assert.Equal(t, slog.LevelDebug, took[0].Level)
	assert.Equal(t, "pay:lost", took[0].Attrs["idem.operation"].String())
	assert.True(t, took[0].Attrs["idem.sent"].Bool())
	for _, r := range h.All() {
		for k := range r.Attrs {
			assert.Contains(t, logStyle, k, "attribute %q of %q is in the one style", k, r.Msg)
		}
	}
}

func TestLoggerSilentByDefault(t *testing.T) {
	// idem must not fall back to slog.Default: point it at a recorder for
	// the length of this test.
	h := &logtest.Records{}
	prev := slog.Default()
	slog.SetDefault(slog.New(h))
	defer slog.SetDefault(prev)

	logCalls(t)
	logCalls(t, idem.WithLogger(nil))
	assert.Zero(t, h.Len(), "records: %+v", h.All())
}

func TestJournalCommitHook(t *testing.T) {
	var (
		mu      sync.Mutex
		changes int
	)
	c, err := idem.Open(filepath.Join(t.TempDir(), "journal.db"), idem.WithBaseTransport(&scriptRT{steps: []step{resp(201)}}), idem.WithHooks(&idem.Hooks{
		JournalCommit: func(ci idem.JournalCommitInfo) {
			mu.Lock()
			defer mu.Unlock()
			if ci.Err == nil && ci.Latency > 0 {
				changes += ci.Changes
			}
		},
	}))
	require.NoError(t, err)
	resp, err := post(t, context.Background(), c.HTTPClient(), `{}`)
	require.NoError(t, err)
	resp.Body.Close()
	require.NoError(t, c.Close())
	mu.Lock()
	defer mu.Unlock()
	assert.GreaterOrEqual(t, changes, 2, "the reservation and the finish mark were committed and reported")
}
