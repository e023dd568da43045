package idemserver_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/idemgo/idem/idemserver"
)

// BenchmarkBufferedHeap sends 200 keyed requests with 1 MiB bodies of
// unknown length at once, holds them in the handler, and reports the heap
// they take (heap-MiB) and how many were admitted, with the default bound
// and with none to speak of (1 TiB): issue 35 measured 237 MiB for the
// latter. Run it with -benchtime=1x.
func BenchmarkBufferedHeap(b *testing.B) {
	const n, size = 200, 1 << 20
	body := strings.Repeat("x", size)
	for _, bound := range []int64{idemserver.DefaultMaxBufferedBytes, 1 << 40} {
		b.Run(fmt.Sprintf("bound=%dMiB", bound>>20), func(b *testing.B) {
			for range b.N {
				s := idemserver.NewMemoryStore()
				entered, release := make(chan struct{}, n), make(chan struct{})
				mw := idemserver.New(s, idemserver.WithSingleTenant(), idemserver.WithMaxBufferedBytes(bound))
				h := mw.Required(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					entered <- struct{}{}
					<-release
					w.WriteHeader(http.StatusCreated)
				}))
				runtime.GC()
				var before, during runtime.MemStats
				runtime.ReadMemStats(&before)
				var wg sync.WaitGroup
				var mu sync.Mutex
				refused := 0
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := httptest.NewRequest(http.MethodPost, "/upload", io.NopCloser(strings.NewReader(body)))
						r.ContentLength = -1
						r.Header.Set("Idempotency-Key", fmt.Sprint("k-", i))
						w := httptest.NewRecorder()
						h.ServeHTTP(w, r)
						if w.Code == http.StatusServiceUnavailable {
							mu.Lock()
							refused++
							mu.Unlock()
							entered <- struct{}{}
						}
					}()
				}
				for range n {
					<-entered
				}
				runtime.GC()
				runtime.ReadMemStats(&during)
				close(release)
				wg.Wait()
				mw.Close()
				s.Close()
				b.ReportMetric(float64(int64(during.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), "heap-MiB")
				b.ReportMetric(float64(n-refused), "admitted")
			}
		})
	}
}
