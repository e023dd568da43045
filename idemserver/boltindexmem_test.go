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
		for i := range n {
			// Nine in ten expire at t0+1s, the others at t0+1h.
			until := t0.Add(time.Second)
			if i%10 == 0 {
				until = t0.Add(time.Hour)
			}
			v := encode(&record{fingerprint: "fp", expires: until, resp: &Response{Status: 201, Body: []byte("ok")}})
			if _, _, err := putRecord(tx, id(i), idHash(id(i)), nil, recordKey(expiresAt(until), id(i)), v); err != nil {
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
	if got := s.flights.indexed(); got != n {
		t.Fatalf("index holds %d keys, want %d", got, n)
	}
	swept, err := s.Sweep(context.Background(), t0.Add(time.Minute))
	if err != nil || swept != n-n/10 {
		t.Fatalf("Sweep: %d, %v; want %d", swept, err, n-n/10)
	}
	after := heapInUse()
	if got := s.flights.indexed(); got != n/10 {
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

// TestBoltIndexDrain checks the index against a plain map while it is
// rebuilt smaller step by step: keys forgotten, replaced and added, in
// the old map or the new, must read as the plain map says, and the old
// map must go once drained.
func TestBoltIndexDrain(t *testing.T) {
	const n = 20000
	f := &flights{}
	ref := map[string]uint64{}
	id := func(i int) string { return fmt.Sprintf("k%05d", i) }
	for i := range n {
		f.index(id(i), uint64(i))
		ref[id(i)] = uint64(i)
	}
	check := func(when string) {
		t.Helper()
		if f.indexed() != len(ref) {
			t.Fatalf("%s: index holds %d keys, want %d", when, f.indexed(), len(ref))
		}
		for i := range n + 100 {
			got, ok := f.lookup(id(i))
			want, wok := ref[id(i)]
			if ok != wok || got != want {
				t.Fatalf("%s: %s is %d %v, want %d %v", when, id(i), got, ok, want, wok)
			}
		}
	}
	drained := false
	for round := 0; round < n/1000; round++ {
		// Forget 1000 keys, one with a stale expiry (kept), ...
		var gone [][]byte
		for i := round * 1000; i < (round+1)*1000; i++ {
			exp := uint64(i)
			if i%100 == 7 {
				exp++ // a record the index no longer names
			}
			if ref[id(i)] == exp {
				delete(ref, id(i))
			}
			gone = append(gone, recordKey(exp, id(i)))
		}
		f.forget(gone)
		// ... replace a key not forgotten yet and add one.
		if j := (round+2)*1000 + 3; j < n {
			f.unindex(id(j), ref[id(j)])
			f.index(id(j), uint64(j)+n)
			ref[id(j)] = uint64(j) + n
		}
		f.index(id(n+round), 1)
		ref[id(n+round)] = 1
		if f.idx.draining != nil {
			drained = true
		}
		check(fmt.Sprintf("round %d", round))
	}
	if !drained {
		t.Fatal("the index was never rebuilt")
	}
	if f.idx.draining != nil {
		t.Errorf("the old map is still held, with %d keys", len(f.idx.draining))
	}
}
