package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemtest"
	"github.com/idemgo/idem/internal/crashtest"
)

// The crash tests run the client in a child process (this test binary,
// re-executed by crashtest), kill it with SIGKILL at a named point, then
// restart: the parent opens the same journal, resumes, and checks with the
// server's counters that the action was performed exactly once under the
// original key.

// crashChildren are the child modes; TestMain runs them instead of tests.
var crashChildren = map[string]func() int{
	"send":   childSend,
	"resume": childResume,
}

const (
	secretToken  = "sk_live_SECRET123"
	secretCookie = "session=SECRETCOOKIE"
	crashBody    = `{"order":1,"amount":4200}`
)

// emitRT announces each attempt to the parent before sending it, and its
// outcome after; with block set it never sends at all.
type emitRT struct {
	base  http.RoundTripper
	block bool
}

func (e emitRT) RoundTrip(r *http.Request) (*http.Response, error) {
	key := r.Header.Get("Idempotency-Key")
	crashtest.Emit("sending", key)
	if e.block {
		time.Sleep(time.Hour) // killed long before this ends
	}
	resp, err := e.base.RoundTrip(r)
	if err != nil {
		crashtest.Emit("error", key)
		return nil, err
	}
	crashtest.Emit("response", key, strconv.Itoa(resp.StatusCode))
	return resp, nil
}

func childClient(opts ...idem.Option) (*idem.Client, error) {
	rt := emitRT{base: &http.Transport{DisableKeepAlives: true}, block: os.Getenv("IDEM_BLOCK") == "1"}
	opts = append([]idem.Option{idem.WithBaseTransport(rt), idem.WithBackoff(time.Millisecond, 10*time.Millisecond)}, opts...)
	return idem.Open(os.Getenv("IDEM_JOURNAL"), opts...)
}

// childSend pays order 1 as a named operation, with credentials.
func childSend() int {
	c, err := childClient()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer c.Close()
	ctx := idem.WithOperation(context.Background(), "pay:order-1")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, os.Getenv("IDEM_URL")+"/v1/charges", strings.NewReader(crashBody))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+secretToken)
	req.Header.Set("Cookie", secretCookie)
	resp, err := c.HTTPClient().Do(req)
	if err != nil {
		crashtest.Emit("failed", err.Error())
		return 1
	}
	resp.Body.Close()
	crashtest.Emit("done", strconv.Itoa(resp.StatusCode))
	return 0
}

// childResume resumes the journal's pending operations.
func childResume() int {
	c, err := childClient(idem.WithResumePrepare(addCredentials))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer c.Close()
	err = c.Resume(context.Background(), func(op idem.Operation, resp *http.Response, err error) {
		if resp != nil {
			resp.Body.Close()
			crashtest.Emit("resumed", op.Key, strconv.Itoa(resp.StatusCode))
		}
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func addCredentials(r *http.Request) error {
	r.Header.Set("Authorization", "Bearer "+secretToken)
	return nil
}

// provider is the payment provider of the crash tests: an idemtest server
// whose handler charges once per run and, with hold set, blocks its first
// run after charging until the test lets it go.
type provider struct {
	*idemtest.Server
	charges atomic.Int64
	ran     chan struct{} // closed when the first run has charged
	hold    chan struct{} // closed by the test to let the first run answer
	once    sync.Once
}

func newProvider(t *testing.T, hold bool, opts ...idemtest.Option) *provider {
	p := &provider{ran: make(chan struct{}), hold: make(chan struct{})}
	if !hold {
		close(p.hold)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+secretToken {
			http.Error(w, "no credentials", http.StatusUnauthorized)
			return
		}
		n := p.charges.Add(1)
		if n == 1 {
			p.once.Do(func() { close(p.ran) })
			<-p.hold
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d"}`, n)
	})
	p.Server = idemtest.NewServer(h, opts...)
	t.Cleanup(func() {
		p.release()
		p.Close()
	})
	return p
}

// waitRan waits until the first run has charged the card.
func (p *provider) waitRan(t *testing.T) {
	t.Helper()
	select {
	case <-p.ran:
	case <-time.After(30 * time.Second):
		t.Fatal("the provider never ran the charge")
	}
}

func (p *provider) release() {
	select {
	case <-p.hold:
	default:
		close(p.hold)
	}
}

func startChild(t *testing.T, mode, journal string, p *provider, block bool) *crashtest.Child {
	env := []string{"IDEM_JOURNAL=" + journal, "IDEM_URL=" + p.URL}
	if block {
		env = append(env, "IDEM_BLOCK=1")
	}
	return crashtest.Start(t, mode, env...)
}

// keyOf returns the key of the first line with the given verb.
func keyOf(t *testing.T, lines []string, verb string) string {
	t.Helper()
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == verb {
			return f[1]
		}
	}
	t.Fatalf("no %q line in %q", verb, lines)
	return ""
}

func is(verb string) func(string) bool {
	return func(l string) bool { return strings.HasPrefix(l, verb+" ") }
}

// restartAndResume opens the journal as the restarted process and resumes.
func restartAndResume(t *testing.T, journal string, p *provider, opts ...idem.Option) []outcome {
	t.Helper()
	opts = append([]idem.Option{idem.WithBaseTransport(p.Client().Transport), idem.WithResumePrepare(addCredentials),
		idem.WithBackoff(time.Millisecond, 10*time.Millisecond)}, opts...)
	c, err := idem.Open(journal, opts...)
	require.NoError(t, err)
	defer c.Close()
	fn, got := collect()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, c.Resume(ctx, fn))
	return got.list()
}

// assertExactlyOnce checks the provider charged once, under key only.
func assertExactlyOnce(t *testing.T, p *provider, key string) {
	t.Helper()
	st := p.Stats()
	assert.Equal(t, int64(1), p.charges.Load(), "charged exactly once")
	assert.Equal(t, 1, st.RunsByKey[key], "performed under the original key")
	assert.Len(t, st.AttemptsByKey, 1, "the server saw only the original key: %v", st.AttemptsByKey)
	assert.Zero(t, st.DuplicateKeys())
}

func assertNothingPending(t *testing.T, journal string) {
	t.Helper()
	store, err := idem.OpenBoltStore(journal, nil)
	require.NoError(t, err)
	defer store.Close()
	pend, err := store.Pending(context.Background(), "", 10)
	require.NoError(t, err)
	assert.Empty(t, pend, "nothing left pending")
}

func TestCrashAfterJournalBeforeSend(t *testing.T) {
	journal := filepath.Join(t.TempDir(), "journal.db")
	p := newProvider(t, false)
	lines := startChild(t, "send", journal, p, true).KillWhen(is("sending"))
	key := keyOf(t, lines, "sending")
	assert.Zero(t, p.Stats().Requests, "nothing reached the server before the kill")

	raw, err := os.ReadFile(journal)
	require.NoError(t, err)
	assert.Contains(t, string(raw), key, "the key is in the journal file")
	assert.Contains(t, string(raw), crashBody, "the replayable body is in the journal file")
	assert.NotContains(t, string(raw), secretToken, "no Authorization value on disk")
	assert.NotContains(t, string(raw), "SECRETCOOKIE", "no Cookie value on disk")

	got := restartAndResume(t, journal, p)
	require.Len(t, got, 1)
	assert.Equal(t, key, got[0].op.Key)
	assert.Equal(t, "pay:order-1", got[0].op.Name)
	assert.Equal(t, http.StatusCreated, got[0].status)
	assertExactlyOnce(t, p, key)
	assertNothingPending(t, journal)
}

func TestCrashAfterServerPerformed(t *testing.T) {
	journal := filepath.Join(t.TempDir(), "journal.db")
	p := newProvider(t, true)
	child := startChild(t, "send", journal, p, false)
	first, ok := child.Next()
	require.True(t, ok, "child said nothing")
	p.waitRan(t) // the card is charged; the response is held
	lines := child.Kill()
	p.release()
	key := keyOf(t, append([]string{first}, lines...), "sending")

	got := restartAndResume(t, journal, p)
	require.Len(t, got, 1)
	assert.Equal(t, http.StatusCreated, got[0].status)
	assert.Equal(t, key, got[0].op.Key)
	assert.Equal(t, 1, p.Stats().Replays, "the resend was answered from the server's store")
	assertExactlyOnce(t, p, key)
	assertNothingPending(t, journal)
}

func TestCrashDuringBackoff(t *testing.T) {
	journal := filepath.Join(t.TempDir(), "journal.db")
	// The first attempt gets 429 with Retry-After: 30, so the child sleeps.
	p := newProvider(t, false, idemtest.WithRetryAfter(30*time.Second), idemtest.WithScript(func(_ string, attempt int) idemtest.Fault {
		if attempt == 1 {
			return idemtest.TooManyRequests
		}
		return idemtest.NoFault
	}))
	lines := startChild(t, "send", journal, p, false).KillWhen(is("response"))
	key := keyOf(t, lines, "response")
	assert.Contains(t, lines, "response "+key+" 429")
	assert.Zero(t, p.charges.Load())

	got := restartAndResume(t, journal, p)
	require.Len(t, got, 1)
	assert.Equal(t, http.StatusCreated, got[0].status)
	assertExactlyOnce(t, p, key)
	assertNothingPending(t, journal)
}

func TestCrashDuringResume(t *testing.T) {
	journal := filepath.Join(t.TempDir(), "journal.db")
	p := newProvider(t, true)
	// First crash: before the request was sent.
	key := keyOf(t, startChild(t, "send", journal, p, true).KillWhen(is("sending")), "sending")
	// Second crash: the restarted process is resuming; the server charged
	// and holds the response when the process dies.
	resumer := startChild(t, "resume", journal, p, false)
	line, ok := resumer.Next()
	require.True(t, ok)
	assert.Equal(t, "sending "+key, line, "resume sent the original key")
	p.waitRan(t)
	resumer.Kill()
	p.release()

	got := restartAndResume(t, journal, p)
	require.Len(t, got, 1)
	assert.Equal(t, key, got[0].op.Key)
	assert.Equal(t, http.StatusCreated, got[0].status)
	assertExactlyOnce(t, p, key)
	assertNothingPending(t, journal)
}

func TestCrashThenExpired(t *testing.T) {
	journal := filepath.Join(t.TempDir(), "journal.db")
	p := newProvider(t, false)
	key := keyOf(t, startChild(t, "send", journal, p, true).KillWhen(is("sending")), "sending")
	time.Sleep(10 * time.Millisecond)

	got := restartAndResume(t, journal, p, idem.WithResendWindow(5*time.Millisecond))
	require.Len(t, got, 1)
	assert.Equal(t, key, got[0].op.Key)
	assert.ErrorIs(t, got[0].err, idem.ErrExpired)
	assert.Zero(t, p.Stats().Requests, "an operation past the window is reported, not sent")
	assertNothingPending(t, journal)
}
