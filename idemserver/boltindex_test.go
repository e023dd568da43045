package idemserver

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestBoltIndexUnderSweeps completes keys from several goroutines, each
// key twice (the second time after its first record expired, unswept or
// swept), while sweeps run: the index in memory must end as the file
// says, which a reopen rebuilds from the file.
func TestBoltIndexUnderSweeps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	s, err := OpenBoltStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	resp := &Response{Status: 201, Header: map[string][]string{}, Body: []byte("ok")}
	complete := func(id string, now time.Time, keep time.Duration) error {
		return completeAt(s, id, now, resp, now.Add(keep))
	}
	const workers, keys = 4, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range keys {
				id := fmt.Sprintf("w%d-k%d", w, i)
				// Kept a second, then claimed again two seconds later
				// and kept an hour.
				if err := complete(id, t0.Add(time.Duration(i)*time.Millisecond), time.Second); err != nil {
					errs <- err
					return
				}
				if err := complete(id, t0.Add(2*time.Second+time.Duration(i)*time.Millisecond), time.Hour); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 20 {
			if _, err := s.Sweep(ctx, t0.Add(time.Duration(i)*200*time.Millisecond)); err != nil {
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	check := func(s *BoltStore) {
		t.Helper()
		// The first records have all expired at +2s, the second not.
		if _, err := s.Sweep(ctx, t0.Add(2*time.Second)); err != nil {
			t.Fatal(err)
		}
		if got := indexLen(s); got != workers*keys {
			t.Errorf("index holds %d keys, want %d", got, workers*keys)
		}
		for w := range workers {
			for i := range keys {
				id := fmt.Sprintf("w%d-k%d", w, i)
				c, err := beginAt(s, id, t0.Add(time.Minute))
				if err != nil || c.State != StateDone {
					t.Fatalf("%s: %v %v, want done", id, c.State, err)
				}
			}
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = OpenBoltStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check(s)
	n, err := s.Sweep(ctx, t0.Add(2*time.Hour))
	if err != nil || n != workers*keys {
		t.Fatalf("Sweep at +2h: %d, %v; want %d", n, err, workers*keys)
	}
	if n := indexLen(s); n != 0 {
		t.Errorf("index holds %d keys after the last sweep, want 0", n)
	}
}

// TestKeyIndexSharedHash: ids that share a hash are one entry of the
// index with every expiry, each removed on its own, and the entry goes
// back to a single expiry, then away; a record swept before its add is
// never indexed.
func TestKeyIndexSharedHash(t *testing.T) {
	var x keyIndex
	x.add(7, 100)
	x.add(7, 200)
	x.add(7, 300)
	x.add(8, 100)
	if got := x.expiries(7, nil); len(got) != 3 || got[0] != 100 || got[1] != 200 || got[2] != 300 {
		t.Fatalf("expiries of 7: %v", got)
	}
	if x.remove(7, 999) || x.n != 4 {
		t.Fatalf("removed an expiry the hash does not have; n %d", x.n)
	}
	if !x.remove(7, 200) || !x.remove(7, 100) {
		t.Fatal("an expiry of 7 not removed")
	}
	if got := x.expiries(7, nil); len(got) != 1 || got[0] != 300 || len(x.multi) != 0 {
		t.Fatalf("expiries of 7 after two removals: %v, multi %v", got, x.multi)
	}
	if !x.remove(7, 300) || len(x.expiries(7, nil)) != 0 || x.n != 1 {
		t.Fatalf("7 still indexed: %v, n %d", x.expiries(7, nil), x.n)
	}
	x.sweptUnindexed(9, 50)
	x.add(9, 50)
	if len(x.expiries(9, nil)) != 0 || x.n != 1 {
		t.Fatalf("a record swept before its add was indexed: %v", x.expiries(9, nil))
	}
	x.add(9, 50)
	if got := x.expiries(9, nil); len(got) != 1 {
		t.Fatalf("a later add of the pair was not indexed: %v", got)
	}
}
