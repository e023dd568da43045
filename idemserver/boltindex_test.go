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
