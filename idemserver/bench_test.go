package idemserver_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/idemserver"
)

// BenchmarkMiddleware measures requests per second over loopback HTTP
// through a bare handler and through the middleware, with 1 and 32
// requests in flight, and reports both side by side with their ratio.
// Every middleware request has a new key: claim, run, store. On the bbolt
// store that is one commit (with fsync) per request, the stored answer,
// shared by the requests in flight (the claim lives in memory); the memory
// store shows the middleware's own cost.
func BenchmarkMiddleware(b *testing.B) {
	stores := []struct {
		name string
		open func(b *testing.B, commits *atomic.Int64) idemserver.Store
	}{
		{"bolt", func(b *testing.B, commits *atomic.Int64) idemserver.Store {
			s, err := idemserver.OpenBoltStore(filepath.Join(b.TempDir(), "keys.db"), &idemserver.BoltOptions{
				OnCommit: func(int, time.Duration, error) { commits.Add(1) },
			})
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
		{"memory", func(*testing.B, *atomic.Int64) idemserver.Store { return idemserver.NewMemoryStore() }},
	}
	for _, st := range stores {
		for _, inflight := range []int{1, 32} {
			b.Run(fmt.Sprintf("store=%s/inflight=%d", st.name, inflight), func(b *testing.B) {
				var commits atomic.Int64
				benchMiddleware(b, st.open(b, &commits), inflight)
				if n := commits.Load(); n > 0 {
					b.ReportMetric(float64(b.N)/float64(n), "req/commit")
				}
			})
		}
	}
}

func benchMiddleware(b *testing.B, store idemserver.Store, inflight int) {
	defer store.Close()
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ord_1","status":"created"}`)
	})
	mux := http.NewServeMux()
	mux.Handle("/bare", handler)
	mux.Handle("/mw", idemserver.New(store, idemserver.WithSingleTenant()).Required(handler))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: inflight}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}

	load(b, hc, srv.URL+"/bare", inflight, inflight, "") // open the connections
	b.ResetTimer()
	// Bare and middleware requests alternate in rounds, so that both see
	// the same background load on a shared machine. CPU time (client and
	// server, both in this process) is disturbed by other load far less
	// than wall time: mw/bare-cpu is the figure to compare across runs.
	var bare, mw, bareCPU, mwCPU time.Duration
	const rounds = 10
	for i := range rounds {
		n := b.N / rounds
		if i == rounds-1 {
			n += b.N % rounds
		}
		c := cpuTime()
		bare += load(b, hc, srv.URL+"/bare", inflight, n, "")
		c2 := cpuTime()
		mw += load(b, hc, srv.URL+"/mw", inflight, n, fmt.Sprintf("k%d-%d-", inflight, i))
		bareCPU, mwCPU = bareCPU+c2-c, mwCPU+cpuTime()-c2
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/bare.Seconds(), "bare-req/s")
	b.ReportMetric(float64(b.N)/mw.Seconds(), "mw-req/s")
	b.ReportMetric(bare.Seconds()/mw.Seconds(), "mw/bare")
	if bareCPU > 0 && mwCPU > 0 {
		b.ReportMetric(float64(bareCPU.Microseconds())/float64(b.N), "bare-cpu-µs/op")
		b.ReportMetric(float64(mwCPU.Microseconds())/float64(b.N), "mw-cpu-µs/op")
		b.ReportMetric(bareCPU.Seconds()/mwCPU.Seconds(), "mw/bare-cpu")
	}
}

// load sends n POSTs to url from inflight goroutines and returns how long
// they took; with a key prefix each carries a new key.
func load(b *testing.B, hc *http.Client, url string, inflight, n int, prefix string) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":4200,"currency":"eur"}`))
				if prefix != "" {
					req.Header.Set("Idempotency-Key", prefix+strconv.FormatInt(i, 10))
				}
				resp, err := hc.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}
