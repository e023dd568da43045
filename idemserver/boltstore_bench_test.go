package idemserver

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// BenchmarkBoltComplete measures the BoltStore alone: Begin and Complete
// of new keys from 32 goroutines, ids random (as the middleware's are: a
// hash) or in order, and reports the commits, group sizes and pages each
// request costs.
func BenchmarkBoltComplete(b *testing.B) {
	for _, order := range []string{"random", "ordered"} {
		b.Run("ids="+order, func(b *testing.B) {
			var commits atomic.Int64
			s, err := OpenBoltStore(filepath.Join(b.TempDir(), "keys.db"), &BoltOptions{OnCommit: func(int, time.Duration, error) { commits.Add(1) }})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			resp := &Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ord_1","status":"created"}`)}
			var next atomic.Int64
			one := func(i int64) {
				id := fmt.Sprintf("%064d", i)
				if order == "random" {
					id = hexSum([]byte(strconv.FormatInt(i, 10)))
				}
				now := time.Now()
				c, err := s.Begin(ctx, Begin{ID: id, Fingerprint: hexSum([]byte(id)), Now: now, LeaseUntil: now.Add(time.Minute)})
				if err == nil {
					err = s.Complete(ctx, Completion{ID: id, Token: c.Token, Response: resp, Now: now, Until: now.Add(24 * time.Hour)})
				}
				if err != nil {
					b.Error(err)
				}
			}
			for range 20000 { // a store that holds some keys already
				one(next.Add(1))
			}
			st0, c0 := boltTxStats(b, s), commits.Load()
			b.ResetTimer()
			var wg sync.WaitGroup
			var done atomic.Int64
			for range 32 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for done.Add(1) <= int64(b.N) {
						one(next.Add(1))
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			st, n := boltTxStats(b, s), float64(commits.Load()-c0)
			b.ReportMetric(float64(b.N)/n, "req/commit")
			b.ReportMetric(float64(st.Write-st0.Write)/n, "pages/commit")
			b.ReportMetric(float64(st.Write-st0.Write)/float64(b.N), "pages/req")
			b.ReportMetric(float64(st.NodeCount-st0.NodeCount)/float64(b.N), "nodes/req")
			b.ReportMetric(float64(st.Split-st0.Split)/float64(b.N), "splits/req")
			var size int64
			s.f.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil })
			b.ReportMetric(float64(size)/float64(next.Load()), "file-B/key")
		})
	}
}
