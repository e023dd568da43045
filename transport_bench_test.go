package idem_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemgo/idem"
)

// benchBody is the small JSON payload of every benchmark request.
var benchBody = []byte(`{"amount":4200,"currency":"eur","customer":"cus_123","description":"order 42"}`)

// benchServer answers every POST with a small 201, as a payment API would.
func benchServer(b *testing.B) (*httptest.Server, *http.Transport) {
	b.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":"ch_1","status":"succeeded"}`))
	}))
	tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}
	b.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
	})
	return srv, tr
}

// inFlight runs fn b.N times from n goroutines.
func inFlight(b *testing.B, n int, fn func() error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	b.ResetTimer()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if err := fn(); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// BenchmarkKeyedPOST compares, in one run, a keyed POST over loopback sent
// by bare net/http (key set by hand, nothing journaled), by idem with the
// memory store and by idem with the bbolt journal, at 1 and 32 in flight.
// Compare the req/s columns of one run, not across runs.
func BenchmarkKeyedPOST(b *testing.B) {
	for _, n := range []int{1, 32} {
		b.Run(fmt.Sprintf("inflight=%d/nethttp", n), func(b *testing.B) {
			srv, tr := benchServer(b)
			c := &http.Client{Transport: tr}
			var seq atomic.Int64
			b.ReportAllocs()
			inFlight(b, n, func() error {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", bytes.NewReader(benchBody))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", fmt.Sprintf("k-%d", seq.Add(1)))
				return doDiscard(c, req)
			})
		})
		b.Run(fmt.Sprintf("inflight=%d/idem-memory", n), func(b *testing.B) {
			srv, tr := benchServer(b)
			ic := idem.New(idem.NewMemoryStore(), idem.WithBaseTransport(tr))
			defer ic.Close()
			benchIdem(b, n, ic.HTTPClient(), srv.URL)
		})
		b.Run(fmt.Sprintf("inflight=%d/idem-bbolt", n), func(b *testing.B) {
			srv, tr := benchServer(b)
			ic, err := idem.Open(filepath.Join(b.TempDir(), "journal.db"), idem.WithBaseTransport(tr))
			if err != nil {
				b.Fatal(err)
			}
			defer ic.Close()
			benchIdem(b, n, ic.HTTPClient(), srv.URL)
		})
	}
}

func benchIdem(b *testing.B, n int, c *http.Client, url string) {
	b.ReportAllocs()
	inFlight(b, n, func() error {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/charges", bytes.NewReader(benchBody))
		req.Header.Set("Content-Type", "application/json")
		return doDiscard(c, req)
	})
}

func doDiscard(c *http.Client, req *http.Request) error {
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}
