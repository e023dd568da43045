package idemserver_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"weak"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
)

// stuckSweep wraps a store whose Sweep hangs, its context ignored, until
// release is closed: a database that stopped answering.
type stuckSweep struct {
	idemserver.Store
	entered chan struct{}
	release chan struct{}
}

func (s *stuckSweep) Sweep(ctx context.Context, now time.Time) (int, error) {
	s.entered <- struct{}{}
	<-s.release
	return 0, nil
}

// TestMiddlewareCloseBoundedByStoreTimeout: Close waits for a sweep that
// does not end at most the store timeout, and says what it stopped
// waiting for.
func TestMiddlewareCloseBoundedByStoreTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &stuckSweep{Store: idemserver.NewMemoryStore(), entered: make(chan struct{}, 1), release: make(chan struct{})}
		mw := idemserver.New(st, idemserver.WithSingleTenant(), idemserver.WithSweepInterval(time.Minute), idemserver.WithStoreTimeout(2*time.Second))
		h := mw.Required(&app{})
		time.Sleep(2 * time.Minute)
		do(h, req{key: "k1", body: "a"}) // starts a sweep, which hangs
		<-st.entered
		closed := make(chan error, 1)
		go func() { closed <- mw.Close() }()
		time.Sleep(3 * time.Second) // fake time: past the store timeout
		synctest.Wait()
		returned := false
		var err error
		select {
		case err = <-closed:
			returned = true
		default:
		}
		close(st.release)
		if !returned {
			err = <-closed
		}
		require.True(t, returned, "Close waited for a stuck sweep past the store timeout")
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorContains(t, err, "sweep")
	})
}

// slowRenew wraps a store whose Renew waits until release is closed,
// once it said so on entered.
type slowRenew struct {
	idemserver.Store
	entered chan struct{}
	release chan struct{}
}

func (s *slowRenew) Renew(ctx context.Context, id, token string, now, until time.Time) error {
	s.entered <- struct{}{}
	<-s.release
	return s.Store.Renew(ctx, id, token, now, until)
}

// requestValue is the key of a value a test puts in a request's context.
type requestValue struct{}

// TestFenceNotRearmedAfterRequest: a renewal that returns after the
// request ended does not re-arm the fence timer, which would keep the
// finished request's state (and everything its context holds) alive for
// most of a lease.
func TestFenceNotRearmedAfterRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &slowRenew{Store: idemserver.NewMemoryStore(), entered: make(chan struct{}, 1), release: make(chan struct{})}
		mw := idemserver.New(st, idemserver.WithSingleTenant(), idemserver.WithLease(30*time.Second))
		finish := make(chan struct{})
		h := mw.Required(&app{answer: func(w http.ResponseWriter, r *http.Request, run int) {
			<-finish
			created(w, r, run)
		}})
		held, served := serveHolding(h)
		<-st.entered  // fake time: the first renewal, at a third of the lease, is under way
		close(finish) // the handler returns; the renewals stop while one is under way
		synctest.Wait()
		close(st.release)
		<-served
		// Fake time: to 25 s, past the end of the first fence (22.5 s,
		// three quarters of the lease: a stopped timer may stay in the
		// runtime's heap until then), before the end of a fence re-armed
		// by the renewal that returned at 10 s (32.5 s).
		time.Sleep(15 * time.Second)
		synctest.Wait()
		runtime.GC()
		runtime.GC()
		assert.Nil(t, held.Value(), "the finished request's context is still referenced: the fence timer was re-armed after the request ended")
		time.Sleep(time.Minute) // let a re-armed fence fire, so that the bubble ends
	})
}

// serveHolding serves one keyed request through h in a goroutine, with a
// value in its context that nothing else references, and returns a weak
// pointer to that value and a channel closed when the request ended. It
// is not inlined, so that the caller's frame holds no reference.
//
//go:noinline
func serveHolding(h http.Handler) (weak.Pointer[[64]byte], <-chan struct{}) {
	v := new([64]byte)
	r := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader("a"))
	r.Header.Set("Idempotency-Key", "k1")
	r = r.WithContext(context.WithValue(r.Context(), requestValue{}, v))
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	return weak.Make(v), done
}

// TestLocalStoreHoldsKeyWhileHandlerRuns: with an in-process store, a
// request whose handler still runs keeps its key whatever the clock says:
// here the middleware's clock jumps past the lease between two renewals,
// as it does for a process paused (SIGSTOP, a GC pause, a VM migration)
// longer than its lease, and a second request with the same key is
// answered 409, never run.
func TestLocalStoreHoldsKeyWhileHandlerRuns(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		var skew atomic.Int64
		finish, entered := make(chan struct{}), make(chan struct{})
		a := &app{answer: func(w http.ResponseWriter, r *http.Request, run int) {
			if run == 1 {
				close(entered)
				<-finish
			}
			created(w, r, run)
		}}
		mw := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithLease(time.Second))
		idemserver.SetClock(mw, func() time.Time { return time.Now().Add(time.Duration(skew.Load())) })
		h := mw.Required(a)
		var first *httptest.ResponseRecorder
		done := make(chan struct{})
		go func() {
			defer close(done)
			first = do(h, req{key: "k1", body: "a"})
		}()
		<-entered
		time.Sleep(1500 * time.Millisecond) // fake time: renewals keep the lease
		synctest.Wait()
		skew.Store(int64(5 * time.Second)) // the wall clock moved on while this process stood still
		second := do(h, req{key: "k1", body: "a"})
		assert.Equal(t, http.StatusConflict, second.Code, "the key of a running handler went to another request")
		close(finish)
		<-done
		assert.Equal(t, http.StatusCreated, first.Code, "the handler's own answer stands: its key was never lost")
		assert.EqualValues(t, 1, a.runs.Load(), "the handler ran once")
		third := do(h, req{key: "k1", body: "a"})
		assert.Equal(t, "true", third.Header().Get(idemserver.ReplayedHeader), "a retry gets the stored answer")
	})
}
