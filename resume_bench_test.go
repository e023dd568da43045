package idem_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemgo/idem"
)

// resumeOps is how many operations BenchmarkResume resumes or sends.
const resumeOps = 10_000

// BenchmarkResume compares, in one run, resuming resumeOps pending
// operations from a bbolt journal with sending as many fresh durable
// requests at the same concurrency (the Resume default, 8). One iteration
// is the whole batch; run it with -benchtime=1x (or 3x) and compare ns/op.
func BenchmarkResume(b *testing.B) {
	const workers = 8
	b.Run("fresh", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			srv, tr := benchServer(b)
			c, err := idem.Open(filepath.Join(b.TempDir(), "journal.db"), idem.WithBaseTransport(tr))
			if err != nil {
				b.Fatal(err)
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			b.StartTimer()
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= resumeOps {
						req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", bytes.NewReader(benchBody))
						req.Header.Set("Content-Type", "application/json")
						if err := doDiscard(c.HTTPClient(), req); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			c.Close()
		}
		b.ReportMetric(float64(resumeOps*b.N)/b.Elapsed().Seconds(), "ops/s")
	})
	b.Run("resume", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			srv, tr := benchServer(b)
			journal := filepath.Join(b.TempDir(), "journal.db")
			fillPending(b, journal, srv.URL)
			c, err := idem.Open(journal, idem.WithBaseTransport(tr), idem.WithResumeConcurrency(workers))
			if err != nil {
				b.Fatal(err)
			}
			var resumed atomic.Int64
			b.StartTimer()
			err = c.Resume(context.Background(), func(op idem.Operation, resp *http.Response, err error) {
				if err != nil {
					b.Error(err)
					return
				}
				resp.Body.Close()
				resumed.Add(1)
			})
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			if resumed.Load() != resumeOps {
				b.Fatalf("resumed %d of %d", resumed.Load(), resumeOps)
			}
			c.Close()
		}
		b.ReportMetric(float64(resumeOps*b.N)/b.Elapsed().Seconds(), "ops/s")
	})
}

// fillPending journals resumeOps pending operations, as a crashed process
// would have left them.
func fillPending(b *testing.B, journal, url string) {
	b.Helper()
	store, err := idem.OpenBoltStore(journal, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= resumeOps {
				now := time.Now()
				op := idem.Operation{
					Key: uuid.Must(uuid.NewV7()).String(), Method: http.MethodPost, URL: url + "/v1/charges",
					State: idem.StatePending, Created: now, Updated: now,
					Header: http.Header{"Content-Type": {"application/json"}}, Body: benchBody,
				}
				if _, _, err := store.Reserve(context.Background(), op); err != nil {
					b.Error(fmt.Errorf("reserve: %w", err))
					return
				}
			}
		}()
	}
	wg.Wait()
}
