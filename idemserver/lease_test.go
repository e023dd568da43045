package idemserver_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemserver"
)

func TestLeaseRenewedWhileHandlerRuns(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		a := &app{answer: func(w http.ResponseWriter, r *http.Request, run int) {
			if run == 1 {
				time.Sleep(10 * time.Minute) // a slow handler, far past its lease
			}
			created(w, r, run)
		}}
		h := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithLease(30*time.Second)).Required(a)
		done := make(chan struct{})
		go func() {
			defer close(done)
			do(h, req{key: "k1", body: "a"})
		}()
		for range 15 {
			time.Sleep(30 * time.Second)
			assert.Equal(t, http.StatusConflict, do(h, req{key: "k1", body: "a"}).Code, "at %v", time.Now())
		}
		<-done
		assert.EqualValues(t, 1, a.runs.Load())
		assert.Equal(t, "true", do(h, req{key: "k1", body: "a"}).Header().Get(idemserver.ReplayedHeader))
	})
}

// stalled wraps a store and fails Renew calls while stall is set, as for
// a process cut off from a shared store.
type stalled struct {
	idemserver.Store
	stall atomic.Bool
}

func (s *stalled) Renew(ctx context.Context, id, token string, now, until time.Time) error {
	if s.stall.Load() {
		return idem.ErrJournalWrite
	}
	return s.Store.Renew(ctx, id, token, now, until)
}

// TestFencing: a handler whose renewals fail is cancelled with ErrLockLost
// before its lease lapses, and its client gets 503, so that the two
// clients of one key never get two different 2xx answers.
func TestFencing(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		st := &stalled{Store: s}
		st.stall.Store(true)
		var (
			cause     atomic.Value
			stoppedAt time.Time
		)
		start := time.Now()
		a := &app{answer: func(w http.ResponseWriter, r *http.Request, run int) {
			if run == 1 {
				<-r.Context().Done()
				stoppedAt = time.Now()
				cause.Store(context.Cause(r.Context()))
			}
			created(w, r, run)
		}}
		h := idemserver.New(st, idemserver.WithSingleTenant(), idemserver.WithLease(30*time.Second)).Required(a)
		var first *httptest.ResponseRecorder
		done := make(chan struct{})
		go func() {
			defer close(done)
			first = do(h, req{key: "k1", body: "a"})
		}()
		time.Sleep(29 * time.Second)
		select {
		case <-done:
		default:
			t.Fatal("the handler whose renewals fail still runs a second before its lease lapses")
		}
		assert.ErrorIs(t, cause.Load().(error), idemserver.ErrLockLost)
		assert.Less(t, stoppedAt.Sub(start), 30*time.Second, "cancelled before the lease lapsed")
		assert.Equal(t, http.StatusServiceUnavailable, first.Code, "its answer is withheld")
		assert.Equal(t, idemserver.ProblemNotStored, problemType(t, first))

		assert.Equal(t, http.StatusConflict, do(h, req{key: "k1", body: "a"}).Code, "within the lease")
		time.Sleep(time.Second)
		second := do(h, req{key: "k1", body: "a"})
		assert.Equal(t, http.StatusCreated, second.Code, "after the lease the next request runs")
		assert.Empty(t, second.Header().Get(idemserver.ReplayedHeader))
		w := do(h, req{key: "k1", body: "a"})
		assert.Equal(t, second.Body.String(), w.Body.String())
		assert.EqualValues(t, 2, a.runs.Load())
	})
}
