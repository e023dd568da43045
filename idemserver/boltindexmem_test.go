package idemserver

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// heapInUse returns the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestBoltIndexShrinksAfterSweeps fills the index of stored keys with
// many keys (middleware-sized 64-byte ids), then sweeps nine in ten: the
// index's memory must follow the keys down. A Go map keeps its buckets
// after deletes, so without a rebuild the index would stay at its peak
// until the process restarts, whatever the sweeps free.
func TestBoltIndexShrinksAfterSweeps(t *testing.T) {
	const n = 30000
	path := filepath.Join(t.TempDir(), "keys.db")
	s, err := OpenBoltStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The records are written straight into the file, in one commit,
	// then the store reopened: Open's index is the same as Completes'.
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	id := func(i int) string { return fmt.Sprintf("%064d", i) }
	err = s.write(context.Background(), func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRecords)
		for i := range n {
			// Nine in ten expire at t0+1s, the others at t0+1h.
			until := t0.Add(time.Second)
			if i%10 == 0 {
				until = t0.Add(time.Hour)
			}
			v := encode(&record{fingerprint: "fp", expires: until, resp: &Response{Status: 201, Body: []byte("ok")}})
			if err := b.Put(recordKey(expiresAt(until), id(i)), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	base := heapInUse()
	s, err = OpenBoltStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	peak := heapInUse()
	if got := len(s.flights.stored); got != n {
		t.Fatalf("index holds %d keys, want %d", got, n)
	}
	swept, err := s.Sweep(context.Background(), t0.Add(time.Minute))
	if err != nil || swept != n-n/10 {
		t.Fatalf("Sweep: %d, %v; want %d", swept, err, n-n/10)
	}
	after := heapInUse()
	if got := len(s.flights.stored); got != n/10 {
		t.Fatalf("index holds %d keys after the sweep, want %d", got, n/10)
	}
	peakPer := float64(peak-base) / n
	afterPer := float64(int64(after)-int64(base)) / (n / 10)
	t.Logf("index: %.0f bytes per key at %d keys; %.0f bytes per key left after sweeping down to %d", peakPer, n, afterPer, n/10)
	// A tenth of the keys left: their share of the peak, with room for
	// a map's slack (twice), is a fifth; a map that kept its peak's
	// buckets holds about half.
	if after > base && after-base > (peak-base)/4 {
		t.Errorf("after sweeping 9 in 10 keys the index still takes %d bytes, %d at its peak: it does not shrink", after-base, peak-base)
	}
	runtime.KeepAlive(s)
}
