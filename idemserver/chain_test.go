package idemserver_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
)

// stepKeys serves a request and returns the keys its handler derives for
// the steps "charge" and "email".
func stepKeys(t *testing.T, h func(http.Handler) http.Handler, r *http.Request) (charge, email string) {
	t.Helper()
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ok bool
		charge, ok = idemserver.StepKey(r.Context(), "charge")
		require.True(t, ok)
		email, _ = idemserver.StepKey(r.Context(), "email")
		k, ok := idemserver.RequestKey(r.Context())
		require.True(t, ok)
		assert.NotEmpty(t, k)
		w.WriteHeader(http.StatusInternalServerError) // not stored: every call runs
	})
	h(inner).ServeHTTP(httptest.NewRecorder(), r)
	return charge, email
}

func TestStepKeys(t *testing.T) {
	mw := idemserver.New(idemserver.NewMemoryStore(), idemserver.WithSingleTenant(), idemserver.WithPrincipal(func(r *http.Request) (string, error) {
		return r.Header.Get("X-User"), nil
	}))
	newReq := func(user, path, key string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}"))
		r.Header.Set("X-User", user)
		r.Header.Set("Idempotency-Key", key)
		return r
	}
	base, email := stepKeys(t, mw.Required, newReq("alice", "/orders", "K"))
	_, err := uuid.Parse(base)
	require.NoError(t, err, "a derived key is a UUID")
	assert.Equal(t, uuid.Version(5), uuid.MustParse(base).Version())
	assert.NotEqual(t, base, email, "steps differ")

	// The same request, on any replica (another middleware, another store),
	// derives the same keys.
	other := idemserver.New(idemserver.NewMemoryStore(), idemserver.WithSingleTenant(), idemserver.WithPrincipal(func(r *http.Request) (string, error) {
		return r.Header.Get("X-User"), nil
	}))
	again, _ := stepKeys(t, other.Required, newReq("alice", "/orders", `"K"`))
	assert.Equal(t, base, again)

	for name, r := range map[string]*http.Request{
		"other principal": newReq("bob", "/orders", "K"),
		"other path":      newReq("alice", "/refunds", "K"),
		"other key":       newReq("alice", "/orders", "K2"),
	} {
		k, _ := stepKeys(t, mw.Required, r)
		assert.NotEqual(t, base, k, name)
	}

	// Outside a keyed request Step leaves the context alone.
	ctx := context.Background()
	assert.Equal(t, ctx, idemserver.Step(ctx, "charge"))
	_, ok := idemserver.StepKey(ctx, "charge")
	assert.False(t, ok)
}

func TestWebhook(t *testing.T) {
	stripeLike := idemserver.JSONEventID("id")
	tests := []struct {
		name    string
		id      idemserver.EventID
		deliver func(id, body string) *http.Request
	}{
		{"standard webhooks header", nil, func(id, body string) *http.Request {
			r := httptest.NewRequest(http.MethodPost, "/hooks", strings.NewReader(body))
			if id != "" {
				r.Header.Set("webhook-id", id)
			}
			r.Header.Set("webhook-timestamp", strings.Repeat("1", len(body)%7+1)) // varies per delivery
			return r
		}},
		{"event id in the JSON body", stripeLike, func(id, body string) *http.Request {
			doc := `{"type":"charge.succeeded","data":` + body + `}`
			if id != "" {
				doc = `{"id":"` + id + `","type":"charge.succeeded","data":` + body + `}`
			}
			return httptest.NewRequest(http.MethodPost, "/hooks", strings.NewReader(doc))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forStores(t, func(t *testing.T, s idemserver.Store) {
				a := &app{answer: func(w http.ResponseWriter, r *http.Request, run int) {
					if run == 2 { // the second event's first delivery fails
						w.WriteHeader(http.StatusInternalServerError)
						return
					}
					w.WriteHeader(http.StatusNoContent)
				}}
				h := idemserver.New(s, idemserver.WithSingleTenant()).Webhook(a, tt.id)
				send := func(id, body string) *httptest.ResponseRecorder {
					w := httptest.NewRecorder()
					h.ServeHTTP(w, tt.deliver(id, body))
					return w
				}
				assert.Equal(t, http.StatusNoContent, send("evt_1", "1").Code)
				// A redelivery (even with another signature or timestamp) is a
				// duplicate: answered from the store, handler not run.
				dup := send("evt_1", "11")
				assert.Equal(t, http.StatusNoContent, dup.Code)
				assert.Equal(t, "true", dup.Header().Get(idemserver.ReplayedHeader))
				assert.EqualValues(t, 1, a.runs.Load())

				// A 5xx releases the id: the sender's retry runs the handler.
				assert.Equal(t, http.StatusInternalServerError, send("evt_2", "2").Code)
				assert.Equal(t, http.StatusNoContent, send("evt_2", "2").Code)
				assert.EqualValues(t, 3, a.runs.Load())

				w := send("", "3")
				assert.Equal(t, http.StatusBadRequest, w.Code)
				assert.Equal(t, idemserver.ProblemMissingKey, problemType(t, w))
				assert.EqualValues(t, 3, a.runs.Load())
			})
		})
	}
}

func TestWebhookConcurrentDuplicate(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		release := make(chan struct{})
		a := &app{answer: func(w http.ResponseWriter, r *http.Request, run int) {
			<-release
			w.WriteHeader(http.StatusOK)
		}}
		h := idemserver.New(s, idemserver.WithSingleTenant()).Webhook(a, nil)
		deliver := func() *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, "/hooks", strings.NewReader("{}"))
			r.Header.Set("Webhook-Id", "msg_1")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			deliver()
		}()
		synctest.Wait()
		w := deliver()
		assert.Equal(t, http.StatusConflict, w.Code)
		assert.NotEmpty(t, w.Header().Get("Retry-After"))
		close(release)
		<-done
		assert.EqualValues(t, 1, a.runs.Load())
	})
}

// TestWebhookBodyAfterEventID: an EventID that reads the request's body
// itself leaves the handler the whole body all the same.
func TestWebhookBodyAfterEventID(t *testing.T) {
	const body = `{"id":"evt_1","amount":1}`
	readsBody := func(r *http.Request, _ []byte) (string, error) {
		b, err := io.ReadAll(r.Body)
		if err != nil || string(b) != body {
			return "", fmt.Errorf("EventID read %q, %v", b, err)
		}
		return "evt_1", nil
	}
	var got string
	h := idemserver.New(idemserver.NewMemoryStore(), idemserver.WithSingleTenant()).Webhook(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = string(b)
		w.WriteHeader(http.StatusNoContent)
	}), readsBody)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/hooks", strings.NewReader(body)))
	assert.Equal(t, http.StatusNoContent, w.Code, w.Body.String())
	assert.Equal(t, body, got, "the handler's body")
}
