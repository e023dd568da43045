package pgstore_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/pgstore"
)

// TestLateMarksOfALostLease is the shared journal's double charge: replica
// A sends a payment, then stalls past its lease (here its lease is lapsed
// by hand while the provider holds its request); replica B's Resume takes
// the operation over, resends it under its key and finishes it as
// succeeded/201. Then A wakes, its attempts run out on 503s, and it
// writes its Attempts and Finish(failed): marks of an owner that lost the
// operation, which must change nothing. Before the marks were fenced, A's
// "failed" overwrote B's "succeeded", and an operator re-driving the
// failed payment under a new name charged it twice.
func TestLateMarksOfALostLease(t *testing.T) {
	var logs lockedBuffer
	a := openStore(t, pgstore.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	b := replica(t, a)
	ctx := testContext(t)

	var (
		mu       sync.Mutex
		requests int
	)
	entered, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests++
		n := requests
		mu.Unlock()
		switch n {
		case 1: // A's first request: held while A "stalls"
			close(entered)
			<-release
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2: // B's resend: the charge goes through
			w.WriteHeader(http.StatusCreated)
		default: // A's retries, after it woke
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()

	ca := idem.New(a, quickRetries, idem.WithMaxAttempts(3), idem.WithOwner("replica-a"))
	cb := idem.New(b, quickRetries, idem.WithOwner("replica-b"))
	defer cb.Close()

	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(idem.WithOperation(ctx, "pay:fenced"), http.MethodPost, srv.URL+chargePath, strings.NewReader(orderBody("fenced")))
		req.Header.Set("Content-Type", "application/json")
		resp, err := ca.HTTPClient().Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	<-entered
	key := keyOf(t, a, "pay:fenced")

	// A stalls past its lease: the lease lapses while A's request is out.
	_, err := a.Pool().Exec(ctx, `UPDATE `+pgx.Identifier{a.Schema(), "operations"}.Sanitize()+` SET lease_until = 0 WHERE key = $1`, key)
	require.NoError(t, err)

	var resumed []string
	require.NoError(t, cb.Resume(ctx, func(op idem.Operation, resp *http.Response, err error) {
		if resp != nil {
			resp.Body.Close()
		}
		resumed = append(resumed, op.Name)
		assert.NoError(t, err, "B's resend of %s", op.Name)
	}))
	require.Equal(t, []string{"pay:fenced"}, resumed, "replica B takes over the lapsed operation")
	byB, err := b.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, idem.StateSucceeded, byB.State, "B finished the operation")
	require.Equal(t, http.StatusCreated, byB.LastStatus)

	// A wakes: its attempts run out on 503s, and it writes its outcome.
	close(release)
	assert.Equal(t, http.StatusServiceUnavailable, <-done, "A's caller gets the last 503")
	require.NoError(t, ca.Close()) // every mark of A is written

	got, err := b.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, got.State, "A's late Finish(failed) must not overwrite B's outcome")
	assert.Equal(t, http.StatusCreated, got.LastStatus, "A's late marks must not change B's record")
	assert.Equal(t, "replica-b", got.Owner)
	assert.Equal(t, byB.Attempts, got.Attempts, "A's late Attempts are not counted on B's record")
	assert.True(t, got.Updated.Equal(byB.Updated), "A's late marks leave Updated as B wrote it")
	mu.Lock()
	assert.Equal(t, 3+1, requests, "A's three requests and B's one")
	mu.Unlock()
	// A's two Attempts and its Finish were each ignored, and said so.
	var ignored int
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=INFO") && strings.Contains(line, "changed nothing") {
			assert.Contains(t, line, key)
			assert.Contains(t, line, "replica-a")
			ignored++
		}
	}
	assert.Equal(t, 3, ignored, "one Info line per ignored mark:\n%s", logs.String())
}

// lockedBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
