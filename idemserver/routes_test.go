package idemserver_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
)

// TestSafeMethodsPassThrough: a read with a key sees the current state,
// not an answer stored for an earlier read.
func TestSafeMethodsPassThrough(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace} {
		t.Run(method, func(t *testing.T) {
			forStores(t, func(t *testing.T, s idemserver.Store) {
				a := &app{}
				h := idemserver.New(s, idemserver.WithSingleTenant()).Required(a)
				for range 2 {
					w := do(h, req{method: method, key: "k1"})
					assert.Equal(t, http.StatusCreated, w.Code)
					assert.Empty(t, w.Header().Get(idemserver.ReplayedHeader))
				}
				assert.EqualValues(t, 2, a.runs.Load(), "both reads ran")

				// Opted in, they are deduplicated like any other method.
				b := &app{}
				h = idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithSafeMethods(true)).Required(b)
				do(h, req{method: method, key: "k2"})
				assert.Equal(t, "true", do(h, req{method: method, key: "k2"}).Header().Get(idemserver.ReplayedHeader))
				assert.EqualValues(t, 1, b.runs.Load())
			})
		})
	}
}

// TestWebhookClientErrorRedelivered: a receiver that answered 404 (the
// object its event names is not committed yet) processes the redelivery.
func TestWebhookClientErrorRedelivered(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		send := func(h http.Handler) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, "/hooks", strings.NewReader(`{}`))
			r.Header.Set("webhook-id", "evt_1")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		a := &app{answer: func(w http.ResponseWriter, _ *http.Request, run int) {
			if run == 1 {
				w.WriteHeader(http.StatusNotFound)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		}}
		h := idemserver.New(s, idemserver.WithSingleTenant()).Webhook(a, nil)
		assert.Equal(t, http.StatusNotFound, send(h).Code)
		assert.Equal(t, http.StatusNoContent, send(h).Code, "the redelivery ran")
		assert.EqualValues(t, 2, a.runs.Load())
		assert.Equal(t, "true", send(h).Header().Get(idemserver.ReplayedHeader), "the 2xx is stored")

		// WithWebhookClientErrors(true) keeps 4xx answers too.
		b := &app{answer: func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusGone) }}
		h = idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithWebhookClientErrors(true)).Webhook(b, idemserver.HeaderEventID("X-Event"))
		for range 2 {
			r := httptest.NewRequest(http.MethodPost, "/hooks/b", strings.NewReader(`{}`))
			r.Header.Set("X-Event", "evt_2")
			h.ServeHTTP(httptest.NewRecorder(), r)
		}
		assert.EqualValues(t, 1, b.runs.Load())
	})
}

// TestReplayHeaders: the defaults cannot be changed from outside, and
// per-principal headers are refused unless opted in.
func TestReplayHeaders(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		cookie := func(w http.ResponseWriter, r *http.Request, run int) {
			http.SetCookie(w, &http.Cookie{Name: "session", Value: "first"})
			created(w, r, run)
		}
		defaults := idemserver.DefaultReplayHeaders()
		defaults[0] = "Set-Cookie" // a caller's copy, not the package's
		h := idemserver.New(s, idemserver.WithSingleTenant()).Required(&app{answer: cookie})
		do(h, req{key: "k1"})
		w := do(h, req{key: "k1"})
		assert.Equal(t, "true", w.Header().Get(idemserver.ReplayedHeader))
		assert.Empty(t, w.Header().Get("Set-Cookie"))
		assert.Equal(t, "application/json", w.Header().Get("Content-Type"))

		var log bytes.Buffer
		h = idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithReplayHeaders("Content-Type", "set-cookie"),
			idemserver.WithLogger(slog.New(slog.NewTextHandler(&log, nil)))).Required(&app{answer: cookie})
		do(h, req{key: "k2"})
		assert.Empty(t, do(h, req{key: "k2"}).Header().Get("Set-Cookie"), "refused")
		assert.Contains(t, log.String(), "Set-Cookie")

		h = idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithPrincipalReplayHeaders("Set-Cookie")).Required(&app{answer: cookie})
		do(h, req{key: "k3"})
		assert.Contains(t, do(h, req{key: "k3"}).Header().Get("Set-Cookie"), "session=first", "opted in")
	})
}

// TestStepKeyFollowsPayload: the same client key with another payload
// (after its retention) derives other downstream keys.
func TestStepKeyFollowsPayload(t *testing.T) {
	mw := idemserver.New(idemserver.NewMemoryStore(), idemserver.WithSingleTenant(), idemserver.WithStoreClientErrors(false))
	var keys []string
	h := mw.Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, ok := idemserver.StepKey(r.Context(), "charge")
		require.True(t, ok)
		keys = append(keys, k)
		w.WriteHeader(http.StatusConflict) // released, so the key can be used again
	}))
	do(h, req{key: "k1", body: "amount=10"})
	do(h, req{key: "k1", body: "amount=10"})
	do(h, req{key: "k1", body: "amount=99"})
	require.Len(t, keys, 3)
	assert.Equal(t, keys[0], keys[1], "same payload, same downstream key")
	assert.NotEqual(t, keys[0], keys[2], "another payload, another downstream key")
}

// TestSweepOffRequestPath: a request does not wait for the sweep it
// starts; Close waits for it.
func TestSweepOffRequestPath(t *testing.T) {
	s := &blockingSweep{Store: idemserver.NewMemoryStore(), started: make(chan struct{}), release: make(chan struct{})}
	mw := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithSweepInterval(1))
	h := mw.Required(&app{})
	do(h, req{key: "k1"}) // returns although the sweep it started blocks
	<-s.started
	close(s.release)
	require.NoError(t, mw.Close())
}

type blockingSweep struct {
	idemserver.Store
	started, release chan struct{}
}

func (s *blockingSweep) Sweep(ctx context.Context, now time.Time) (int, error) {
	close(s.started)
	<-s.release
	return 0, nil
}
