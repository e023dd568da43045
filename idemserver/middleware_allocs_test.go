package idemserver_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/idemgo/idem/idemserver"
)

// TestMiddlewareAllocations counts the allocations of a new key through
// the middleware on the memory store, for a handler that sets four
// headers (two of them replayed): 53 before the recorder kept only the
// replay headers at WriteHeader (it cloned the whole header, then picked
// from the clone) and the recorder and renewer became fields of the run,
// 48 after, 46 once the memory store's tokens were a counter, not a
// random UUID.
func TestMiddlewareAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	h := idemserver.New(idemserver.NewMemoryStore(), idemserver.WithSingleTenant()).Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/o/1")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Request-Id", "r1")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":"ord_1"}`))
	}))
	reqs := make([]*http.Request, 300)
	ws := make([]*httptest.ResponseRecorder, len(reqs))
	for i := range reqs {
		reqs[i] = httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"amount":4200}`))
		reqs[i].Header.Set("Idempotency-Key", "key-"+strconv.Itoa(i))
		ws[i] = httptest.NewRecorder()
	}
	i := 0
	allocs := testing.AllocsPerRun(200, func() {
		h.ServeHTTP(ws[i], reqs[i])
		if ws[i].Code != http.StatusCreated {
			t.Fatalf("status %d", ws[i].Code)
		}
		i++
	})
	t.Logf("%.1f allocations per new key", allocs)
	if allocs > 46 {
		t.Errorf("%.1f allocations per new key, want at most 46", allocs)
	}
}
