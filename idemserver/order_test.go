package idemserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemserver"
)

// memAdvancer is an Advancer in memory, outside any transaction.
type memAdvancer struct {
	mu       sync.Mutex
	versions map[string]int64
	fail     error
}

func (a *memAdvancer) Advance(_ context.Context, scope, entity string, version int64) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fail != nil {
		return false, a.fail
	}
	k := scope + "/" + entity
	if v, ok := a.versions[k]; ok && v >= version {
		return false, nil
	}
	a.versions[k] = version
	return true, nil
}

// paymentVersion reads {"payment": ..., "seq": ...}; an event without a
// payment is not ordered.
func paymentVersion(_ *http.Request, body []byte) (string, int64, error) {
	var ev struct {
		Payment string `json:"payment"`
		Seq     *int64 `json:"seq"`
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		return "", 0, err
	}
	if ev.Payment != "" && ev.Seq == nil {
		return "", 0, errors.New("no seq")
	}
	if ev.Seq == nil {
		return ev.Payment, 0, nil
	}
	return ev.Payment, *ev.Seq, nil
}

func deliver(h http.Handler, id, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/hooks/psp", strings.NewReader(body))
	r.Header.Set("webhook-id", id)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestWebhookOrder delivers a payment's events out of order: a stale one
// is answered 200 with StaleEventHeader and its handler does not run; the
// handler gets the whole body; an event without an entity is not ordered;
// a malformed version is 400; an Advancer that fails answers 503 and the
// redelivery runs.
func TestWebhookOrder(t *testing.T) {
	forStores(t, func(t *testing.T, s idemserver.Store) {
		adv := &memAdvancer{versions: map[string]int64{}}
		var mu sync.Mutex
		var bodies []string
		app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, err := io.ReadAll(r.Body)
			require.NoError(t, err)
			mu.Lock()
			bodies = append(bodies, string(b))
			mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		})
		h := idemserver.New(s).Webhook(app, nil, idemserver.WithOrder("psp", adv, paymentVersion))

		w := deliver(h, "evt_2", `{"payment":"p1","seq":2,"status":"succeeded"}`)
		assert.Equal(t, http.StatusNoContent, w.Code)
		assert.Empty(t, w.Header().Get(idemserver.StaleEventHeader))

		w = deliver(h, "evt_1", `{"payment":"p1","seq":1,"status":"pending"}`)
		assert.Equal(t, http.StatusOK, w.Code, w.Body.String())
		assert.Equal(t, "true", w.Header().Get(idemserver.StaleEventHeader), "the older event is stale")

		w = deliver(h, "evt_1b", `{"payment":"p1","seq":2,"status":"succeeded"}`)
		assert.Equal(t, "true", w.Header().Get(idemserver.StaleEventHeader), "an equal version is stale too")

		w = deliver(h, "evt_3", `{"payment":"p1","seq":3,"status":"refunded"}`)
		assert.Equal(t, http.StatusNoContent, w.Code)

		w = deliver(h, "evt_x", `{"note":"unordered"}`)
		assert.Equal(t, http.StatusNoContent, w.Code, "no entity: the handler runs")

		w = deliver(h, "evt_bad", `{"payment":"p1"}`)
		assert.Equal(t, http.StatusBadRequest, w.Code, "a version that cannot be read")

		adv.fail = errors.New("database away")
		w = deliver(h, "evt_4", `{"payment":"p1","seq":4}`)
		assert.Equal(t, http.StatusServiceUnavailable, w.Code)
		adv.fail = nil
		w = deliver(h, "evt_4", `{"payment":"p1","seq":4}`)
		assert.Equal(t, http.StatusNoContent, w.Code, "the redelivery after a 503 runs")

		assert.Equal(t, []string{
			`{"payment":"p1","seq":2,"status":"succeeded"}`,
			`{"payment":"p1","seq":3,"status":"refunded"}`,
			`{"note":"unordered"}`,
			`{"payment":"p1","seq":4}`,
		}, bodies, "the handler ran for the newer events only, each with its whole body")
	})
}
