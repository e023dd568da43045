package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Large bodies: bursts of largeInFlight requests of largeSize bytes each.
const (
	largeSize     = 1 << 20
	largeInFlight = 64
)

// patternBody is a request body that produces its bytes without holding
// them in memory, like a file: whatever body bytes the heap holds are the
// library's copies.
type patternBody struct{ off, size int }

func (p *patternBody) Read(b []byte) (int, error) {
	if p.off >= p.size {
		return 0, io.EOF
	}
	n := min(len(b), p.size-p.off)
	for i := range n {
		b[i] = byte('a' + (p.off+i)%26)
	}
	p.off += n
	return n, nil
}

func (p *patternBody) Close() error { return nil }

// newLargeRequest returns a keyed-by-hand-or-not POST of largeSize bytes
// with ContentLength and GetBody set, as http.NewRequest sets them for an
// in-memory body.
func newLargeRequest(url string, keyByHand bool) (*http.Request, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, &patternBody{size: largeSize})
	if err != nil {
		return nil, err
	}
	req.ContentLength = largeSize
	req.GetBody = func() (io.ReadCloser, error) { return &patternBody{size: largeSize}, nil }
	req.Header.Set("Content-Type", "application/octet-stream")
	if keyByHand {
		req.Header.Set("Idempotency-Key", newKey())
	}
	return req, nil
}

// heapSampler records the peak of the heap's object bytes between start
// and stop, sampling runtime/metrics every 100 µs.
type heapSampler struct {
	peak atomic.Uint64
	stop chan struct{}
	done chan struct{}
}

const heapMetric = "/memory/classes/heap/objects:bytes"

func heapNow() uint64 {
	s := []metrics.Sample{{Name: heapMetric}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func startHeapSampler() *heapSampler {
	h := &heapSampler{stop: make(chan struct{}), done: make(chan struct{})}
	h.peak.Store(heapNow())
	go func() {
		defer close(h.done)
		s := []metrics.Sample{{Name: heapMetric}}
		t := time.NewTicker(100 * time.Microsecond)
		defer t.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-t.C:
				metrics.Read(s)
				if v := s[0].Value.Uint64(); v > h.peak.Load() {
					h.peak.Store(v)
				}
			}
		}
	}()
	return h
}

func (h *heapSampler) finish() uint64 {
	close(h.stop)
	<-h.done
	return h.peak.Load()
}

// BenchmarkLargeBodies sends bursts of 64 POSTs of 1 MiB each; one op is
// one burst. Before each burst the heap is collected; the peak of heap
// object bytes above that baseline during the burst is reported against
// the 64 MiB of bodies, with the bytes allocated per request.
func BenchmarkLargeBodies(b *testing.B) {
	for _, l := range libs {
		b.Run(l.name, func(b *testing.B) {
			base := newBase()
			defer base.CloseIdleConnections()
			c := l.newClient(b, base, b.TempDir(), 2*largeSize)
			defer c.close()
			url := serverURL + pathLarge

			burst := func() error {
				var wg sync.WaitGroup
				errs := make(chan error, largeInFlight)
				for range largeInFlight {
					wg.Go(func() {
						req, err := newLargeRequest(url, l.keyByHand)
						if err == nil {
							var resp *http.Response
							if resp, err = c.do(req); err == nil {
								io.Copy(io.Discard, resp.Body)
								resp.Body.Close()
								if resp.StatusCode != http.StatusOK {
									err = fmt.Errorf("status %d", resp.StatusCode)
								}
							}
						}
						if err != nil {
							errs <- err
						}
					})
				}
				wg.Wait()
				close(errs)
				return <-errs
			}
			if err := burst(); err != nil { // warm the connections
				b.Fatal(err)
			}

			var peakAbove uint64
			var allocated uint64
			var ms runtime.MemStats
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				runtime.GC()
				baseline := heapNow()
				runtime.ReadMemStats(&ms)
				before := ms.TotalAlloc
				h := startHeapSampler()
				b.StartTimer()
				err := burst()
				b.StopTimer()
				peak := h.finish()
				runtime.ReadMemStats(&ms)
				allocated += ms.TotalAlloc - before
				if peak > baseline {
					peakAbove = max(peakAbove, peak-baseline)
				}
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			bodies := float64(largeSize * largeInFlight)
			b.ReportMetric(float64(peakAbove)/(1<<20), "peak-heap-MiB")
			b.ReportMetric(float64(peakAbove)/bodies, "peak/bodies")
			b.ReportMetric(float64(allocated)/float64(b.N*largeInFlight), "B/req")
			b.ReportMetric(float64(allocated)/float64(b.N*largeInFlight)/largeSize, "copies/req")
		})
	}
}
