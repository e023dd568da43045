package idem_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/crashtest"
)

// holdingServer counts the requests it gets and holds the first two until
// their client goes away: the server has performed them, the client never
// learns their answer.
type holdingServer struct {
	*httptest.Server
	requests atomic.Int32
	arrived  chan int32
}

func newHoldingServer(t *testing.T) *holdingServer {
	s := &holdingServer{arrived: make(chan int32, 8)}
	done := make(chan struct{})
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // then the server notices the client going
		n := s.requests.Add(1)
		s.arrived <- n
		if n <= 2 {
			select {
			case <-r.Context().Done(): // the client was killed
			case <-done:
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(s.Close)
	t.Cleanup(func() { close(done) }) // runs first
	return s
}

// wait waits for the server's nth request.
func (s *holdingServer) wait(t *testing.T, n int32) {
	t.Helper()
	for {
		select {
		case got := <-s.arrived:
			if got >= n {
				return
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the server never got request %d", n)
		}
	}
}

// TestCrashKeepsAttemptCounts kills the sending process (SIGKILL) after
// the server got its request, twice: during a call's first attempt, and
// during Resume's resend. Each attempt was journaled as started before it
// was sent, so the journal's Attempts and the next resend's Earlier (and
// so OpenTelemetry's http.request.resend_count) count every request the
// server saw.
func TestCrashKeepsAttemptCounts(t *testing.T) {
	journal := filepath.Join(t.TempDir(), "journal.db")
	s := newHoldingServer(t)
	env := []string{"IDEM_JOURNAL=" + journal, "IDEM_URL=" + s.URL}

	child := crashtest.Start(t, "send", env...)
	first, ok := child.Next()
	require.True(t, ok, "child said nothing")
	s.wait(t, 1)
	key := keyOf(t, append([]string{first}, child.Kill()...), "sending")
	assert.Equal(t, 1, journalAttempts(t, journal, key), "the call's first attempt is in the journal")

	resumer := crashtest.Start(t, "resume", env...)
	line, ok := resumer.Next()
	require.True(t, ok)
	assert.Equal(t, "sending "+key, line)
	s.wait(t, 2)
	resumer.Kill()
	assert.Equal(t, 2, journalAttempts(t, journal, key), "Resume's resend is in the journal")

	var (
		mu      sync.Mutex
		earlier []int
	)
	hooks := &idem.Hooks{AttemptDone: func(a idem.AttemptInfo) {
		mu.Lock()
		earlier = append(earlier, a.Earlier)
		mu.Unlock()
	}}
	c, err := idem.Open(journal, idem.WithBaseTransport(s.Client().Transport), idem.WithResumePrepare(addCredentials), idem.WithHooks(hooks))
	require.NoError(t, err)
	fn, got := collect()
	require.NoError(t, c.Resume(t.Context(), fn))
	require.NoError(t, c.Close())
	require.Len(t, got.list(), 1)
	assert.Equal(t, http.StatusCreated, got.list()[0].status)
	assert.Equal(t, int32(3), s.requests.Load(), "the server saw three requests")
	mu.Lock()
	assert.Equal(t, []int{2}, earlier, "the last resend knows of the two before it")
	mu.Unlock()
	assert.Equal(t, 3, journalAttempts(t, journal, key))
}

// journalAttempts returns the Attempts the journal holds for key.
func journalAttempts(t *testing.T, journal, key string) int {
	t.Helper()
	store, err := idem.OpenBoltStore(journal, nil)
	require.NoError(t, err)
	defer store.Close()
	op, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	return op.Attempts
}
