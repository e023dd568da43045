package boltjournal_test

import (
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/idemgo/idem"
	"github.com/idemgo/idem/boltjournal"
	"github.com/idemgo/idem/idemstore"
	bolt "go.etcd.io/bbolt"
)

// BenchmarkJournal measures durable Reserve+Finish round trips (what one
// keyed request costs the journal) at 1, 32 and 128 concurrent callers for
// the group-commit BoltStore, the same store with one bbolt Update per
// write, and the MemoryStore. Reserve waits for its fsync in both bbolt
// variants; Finish rides the next commit with group commit and is its own
// Update (and fsync) in the per-write baseline. Run:
//
//	go test -run '^$' -bench Journal -benchtime 3s .
func BenchmarkJournal(b *testing.B) {
	stores := []struct {
		name string
		open func(b *testing.B) idemstore.KeyStore
	}{
		{"group", func(b *testing.B) idemstore.KeyStore {
			s, err := boltjournal.Open(filepath.Join(b.TempDir(), "journal.db"), nil)
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
		{"perwrite", func(b *testing.B) idemstore.KeyStore {
			s, err := boltjournal.OpenPerWrite(filepath.Join(b.TempDir(), "journal.db"), nil)
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
		{"memory", func(*testing.B) idemstore.KeyStore { return idem.NewMemoryStore() }},
	}
	body := []byte(`{"amount":4200,"currency":"eur","customer":"cus_123","description":"order 42"}`)
	for _, callers := range []int{1, 32, 128} {
		for _, st := range stores {
			b.Run(fmt.Sprintf("store=%s/callers=%d", st.name, callers), func(b *testing.B) {
				s := st.open(b)
				defer s.Close()
				ctx := b.Context()
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ReportAllocs()
				b.ResetTimer()
				for range callers {
					wg.Go(func() {
						for next.Add(1) <= int64(b.N) {
							op := newOp(uuid.Must(uuid.NewV7()).String())
							op.Body = body
							if _, _, err := s.Reserve(ctx, op); err != nil {
								b.Error(err)
								return
							}
							if err := s.Finish(ctx, op.Key, idemstore.Outcome{State: idemstore.StateSucceeded, Status: 201}); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
			})
		}
	}
}

// BenchmarkBoltPut is the floor of a durable write on this disk: one bbolt
// Update (one commit, two fdatasyncs) putting one 200-byte value under a
// UUIDv7 key, one at a time. idem-bbolt at 1 in flight pays one such
// commit per request. Run it with the journal benchmarks, on the same
// file system (TMPDIR):
//
//	go test -run '^$' -bench 'BoltPut|Journal/store=group/callers=1$' -benchtime 3s .
func BenchmarkBoltPut(b *testing.B) {
	db, err := bolt.Open(filepath.Join(b.TempDir(), "put.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	name := []byte("ops")
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket(name); return err }); err != nil {
		b.Fatal(err)
	}
	val := make([]byte, 200)
	b.ReportAllocs()
	for b.Loop() {
		key := []byte(uuid.Must(uuid.NewV7()).String())
		err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(name).Put(key, val) })
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkStillNamed measures the check made before each commit that the
// journal's path still names the open file (one stat): compare it with a
// commit (BenchmarkBoltPut).
func BenchmarkStillNamed(b *testing.B) {
	s, err := boltjournal.Open(filepath.Join(b.TempDir(), "journal.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ReportAllocs()
	for b.Loop() {
		if err := s.StillNamed(); err != nil {
			b.Fatal(err)
		}
	}
}
