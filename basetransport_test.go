package idem_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
)

// TestDefaultBaseKeepsConnections sends rounds of 8 keyed POSTs that are
// all in flight together (the server holds each until the eighth arrives)
// through a Client with the default base transport. net/http's
// DefaultTransport keeps 2 idle connections per host, so each round after
// the first dialed 6 again; idem's default keeps them all.
func TestDefaultBaseKeepsConnections(t *testing.T) {
	const n, rounds = 8, 4
	var dials atomic.Int64
	var mu sync.Mutex
	arrived := 0
	release := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		arrived++
		if arrived == n {
			close(release)
			release = make(chan struct{})
			arrived = 0
			mu.Unlock()
		} else {
			ch := release
			mu.Unlock()
			select {
			case <-ch:
			case <-time.After(5 * time.Second): // bounded: a round that never fills fails below
			}
		}
		w.WriteHeader(http.StatusCreated)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dials.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	c := idem.New(idem.NewMemoryStore())
	defer c.Close()
	hc := c.HTTPClient()
	for range rounds {
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				resp, err := hc.Post(srv.URL, "application/json", strings.NewReader(`{"a":1}`))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			})
		}
		wg.Wait()
	}
	if got := dials.Load(); got != n {
		t.Errorf("%d connections dialed for %d rounds of %d requests in flight together, want %d (one per request in flight)", got, rounds, n, n)
	}
}
