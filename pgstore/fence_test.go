package pgstore_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
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
	var logs logBuffer
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

// TestLateMarksOfAnotherIncarnation: the same owner name in another
// incarnation (a process restarted, or started twice, under a fixed
// WithOwner) is another holder: once it took the operation over, the
// marks of the store that lost it change nothing, as Renew refuses it.
func TestLateMarksOfAnotherIncarnation(t *testing.T) {
	a := openStore(t)
	b := replica(t, a)
	ctx := testContext(t)
	now := time.Now()
	op := idem.Operation{
		Key: uuid.NewString(), Name: "pay:incarnation", Method: http.MethodPost, URL: "https://pay.example/v1/charges",
		State: idem.StatePending, Created: now.Add(-time.Minute), Owner: "replica-1", LeaseUntil: now.Add(-time.Second),
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(orderBody("incarnation")),
	}
	_, created, err := a.Reserve(ctx, op)
	require.NoError(t, err)
	require.True(t, created)
	got, err := b.Claim(ctx, idem.Lease{Owner: "replica-1", At: now, Until: now.Add(time.Minute)}, "", 0)
	require.NoError(t, err)
	require.Len(t, got, 1, "the other incarnation takes the lapsed operation")

	require.NoError(t, a.Attempt(ctx, op.Key, idem.Attempt{Sent: 1, Status: 503, Reason: "503", At: now, Owner: "replica-1"}))
	require.NoError(t, a.Finish(ctx, op.Key, idem.Outcome{State: idem.StateFailed, Status: 503, URL: op.URL, At: now, Owner: "replica-1"}))
	rec, err := b.Get(ctx, op.Key)
	require.NoError(t, err)
	assert.Equal(t, idem.StatePending, rec.State, "the lost incarnation's Finish changes nothing")
	assert.Zero(t, rec.Attempts, "the lost incarnation's Attempt changes nothing")

	require.NoError(t, b.Finish(ctx, op.Key, idem.Outcome{State: idem.StateSucceeded, Status: 201, Sent: 1, URL: op.URL, At: now, Owner: "replica-1"}))
	rec, err = a.Get(ctx, op.Key)
	require.NoError(t, err)
	assert.Equal(t, idem.StateSucceeded, rec.State, "the holder's Finish is written")
	assert.Equal(t, 201, rec.LastStatus)
}
