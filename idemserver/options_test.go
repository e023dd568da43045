package idemserver_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
)

// TestWaitForFirstAnswer: with WithWait, a duplicate of a request still
// running waits for its answer and gets it as a replay; one whose wait
// runs out gets 409; one whose first request released the key (a 503)
// runs the handler itself.
func TestWaitForFirstAnswer(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		release := make(chan struct{})
		a := &app{answer: func(w http.ResponseWriter, r *http.Request, run int) {
			if run == 1 {
				<-release
			}
			if r.Header.Get("X-Fail") != "" {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			created(w, r, run)
		}}
		h := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithWait(10*time.Second)).Required(a)
		short := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithWait(100*time.Millisecond)).Required(a)
		var first *httptest.ResponseRecorder
		done := make(chan struct{})
		go func() {
			defer close(done)
			first = do(h, req{key: "k1", body: "a"})
		}()
		synctest.Wait() // the first request holds the key in the handler

		w := do(short, req{key: "k1", body: "a"})
		assert.Equal(t, http.StatusConflict, w.Code, "the wait ran out")
		assert.Equal(t, idemserver.ProblemInProgress, problemType(t, w))

		var second *httptest.ResponseRecorder
		waited := make(chan struct{})
		go func() {
			defer close(waited)
			second = do(h, req{key: "k1", body: "a"})
		}()
		synctest.Wait()
		time.Sleep(3 * time.Second) // the duplicate keeps waiting, in the bubble's time
		close(release)
		<-done
		<-waited
		require.Equal(t, http.StatusCreated, first.Code)
		assert.Equal(t, http.StatusCreated, second.Code, second.Body.String())
		assert.Equal(t, "true", second.Header().Get(idemserver.ReplayedHeader))
		assert.Equal(t, first.Body.String(), second.Body.String())
		assert.EqualValues(t, 1, a.runs.Load())

		// A waiting duplicate whose first request is not stored runs.
		a.runs.Store(0)
		release = make(chan struct{})
		fail := http.Header{"X-Fail": {"1"}}
		go func() { do(h, req{key: "k2", body: "a", header: fail}) }()
		synctest.Wait()
		go func() { close(release) }()
		w = do(h, req{key: "k2", body: "a"})
		assert.Equal(t, http.StatusCreated, w.Code, w.Body.String())
		assert.Empty(t, w.Header().Get(idemserver.ReplayedHeader))
		assert.EqualValues(t, 2, a.runs.Load())
	})
}

// TestFingerprintIgnoring: named JSON members, member order and spacing
// are not part of the payload; every other change is, and a body that is
// not JSON is refused.
func TestFingerprintIgnoring(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		a := &app{}
		h := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithFingerprintIgnoring("sent_at", "meta.nonce")).Required(a)
		w := do(h, req{key: "k", body: `{"amount":4200,"sent_at":"10:00","meta":{"nonce":"n1","src":"app"}}`})
		require.Equal(t, http.StatusCreated, w.Code)
		for _, body := range []string{
			`{"amount":4200,"sent_at":"10:01","meta":{"nonce":"n2","src":"app"}}`,
			`{ "meta": {"src":"app", "nonce":"n3"}, "amount": 4200 }`,
			`{"amount":4200,"meta":{"src":"app"}}`,
		} {
			w := do(h, req{key: "k", body: body})
			assert.Equal(t, http.StatusCreated, w.Code, body)
			assert.Equal(t, "true", w.Header().Get(idemserver.ReplayedHeader), body)
		}
		for _, body := range []string{
			`{"amount":4201,"sent_at":"10:00","meta":{"nonce":"n1","src":"app"}}`,
			`{"amount":4200,"meta":{"src":"web"}}`,
			`{"amount":4200.0,"meta":{"src":"app"}}`,
		} {
			assert.Equal(t, http.StatusUnprocessableEntity, do(h, req{key: "k", body: body}).Code, body)
		}
		w = do(h, req{key: "k2", body: `amount=4200`})
		assert.Equal(t, http.StatusBadRequest, w.Code)
		assert.Equal(t, idemserver.ProblemBadRequest, problemType(t, w))
		assert.EqualValues(t, 1, a.runs.Load())
	})
}

// TestWithFingerprint: a fingerprint function decides what of the body is
// the payload.
func TestWithFingerprint(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		a := &app{}
		h := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithFingerprint(func(_ *http.Request, body []byte) ([]byte, error) {
			return body[:min(len(body), 4)], nil // the first four bytes are the payload
		})).Required(a)
		require.Equal(t, http.StatusCreated, do(h, req{key: "k", body: "abcd-1"}).Code)
		assert.Equal(t, "true", do(h, req{key: "k", body: "abcd-2"}).Header().Get(idemserver.ReplayedHeader))
		assert.Equal(t, http.StatusUnprocessableEntity, do(h, req{key: "k", body: "abce-1"}).Code)
		assert.EqualValues(t, 1, a.runs.Load())
	})
}

// TestOnReplayAndIsReplay: the replay hooks run on replays only, in
// order, before the answer is written, and middleware before idemserver's
// tells a replay from a first answer with TrackReplay and IsReplay.
func TestOnReplayAndIsReplay(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		var calls []string
		a := &app{answer: func(w http.ResponseWriter, r *http.Request, run int) {
			assert.False(t, idemserver.IsReplay(r.Context()), "in the handler")
			created(w, r, run)
		}}
		mw := idemserver.New(s, idemserver.WithSingleTenant(),
			idemserver.WithOnReplay(func(w http.ResponseWriter, r *http.Request, resp *idemserver.Response) {
				assert.True(t, idemserver.IsReplay(r.Context()))
				calls = append(calls, "one:"+http.StatusText(resp.Status))
				w.Header().Set("X-Replay-Hook", "1")
			}),
			idemserver.WithOnReplay(func(http.ResponseWriter, *http.Request, *idemserver.Response) { calls = append(calls, "two") }))
		var replays []bool
		outer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r = r.WithContext(idemserver.TrackReplay(r.Context()))
			mw.Required(a).ServeHTTP(w, r)
			replays = append(replays, idemserver.IsReplay(r.Context()))
		})
		first := do(outer, req{key: "k", body: "a"})
		require.Equal(t, http.StatusCreated, first.Code)
		assert.Empty(t, calls)
		again := do(outer, req{key: "k", body: "a"})
		assert.Equal(t, http.StatusCreated, again.Code)
		assert.Equal(t, "1", again.Header().Get("X-Replay-Hook"))
		assert.Equal(t, []string{"one:Created", "two"}, calls)
		assert.Equal(t, []bool{false, true}, replays)
		assert.False(t, idemserver.IsReplay(context.Background()))
	})
}

// countingStore counts the Begin calls that reach its store.
type countingStore struct {
	idemserver.Store
	begins atomic.Int32
}

func (c *countingStore) Begin(ctx context.Context, b idemserver.Begin) (idemserver.Claim, error) {
	c.begins.Add(1)
	return c.Store.Begin(ctx, b)
}

// TestAnswerCache: with WithAnswerCache, a retry of an answer this
// middleware stored is answered without a store call, a reused key with
// another payload still gets 422, and the cache lets go of an answer at
// its expiry, at a Sweep past it, and past its bound.
func TestAnswerCache(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		cs := &countingStore{Store: s}
		a := &app{}
		mw := idemserver.New(cs, idemserver.WithSingleTenant(), idemserver.WithAnswerCache(1<<20), idemserver.WithRetention(time.Hour), idemserver.WithSweepInterval(-1))
		defer mw.Close()
		h := mw.Required(a)
		first := do(h, req{key: "k", body: "a"})
		require.Equal(t, http.StatusCreated, first.Code)
		require.EqualValues(t, 1, cs.begins.Load())
		for range 3 {
			w := do(h, req{key: "k", body: "a"})
			assert.Equal(t, first.Body.String(), w.Body.String())
			assert.Equal(t, "true", w.Header().Get(idemserver.ReplayedHeader))
		}
		assert.Equal(t, http.StatusUnprocessableEntity, do(h, req{key: "k", body: "b"}).Code)
		assert.EqualValues(t, 1, cs.begins.Load(), "answered from the cache")

		time.Sleep(time.Hour) // the answer expires
		_, err := mw.Sweep(context.Background())
		require.NoError(t, err)
		w := do(h, req{key: "k", body: "a"})
		assert.Equal(t, http.StatusCreated, w.Code)
		assert.Empty(t, w.Header().Get(idemserver.ReplayedHeader), "a new run after the retention")
		assert.EqualValues(t, 2, cs.begins.Load())
		assert.EqualValues(t, 2, a.runs.Load())

		// A cache of 700 bytes holds one of these answers (about 500
		// bytes as it counts them): the older one goes to the store again.
		small := idemserver.New(cs, idemserver.WithSingleTenant(), idemserver.WithAnswerCache(700))
		defer small.Close()
		hs := small.Required(a)
		do(hs, req{key: "s1", body: "a"})
		do(hs, req{key: "s2", body: "a"})
		n := cs.begins.Load()
		assert.Equal(t, "true", do(hs, req{key: "s2", body: "a"}).Header().Get(idemserver.ReplayedHeader))
		assert.Equal(t, n, cs.begins.Load(), "the newer answer is cached")
		assert.Equal(t, "true", do(hs, req{key: "s1", body: "a"}).Header().Get(idemserver.ReplayedHeader))
		assert.Equal(t, n+1, cs.begins.Load(), "the older answer was evicted")
	})
}
