package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestLeaderBehindKeptChangesFailsClosed checks that a caller of Do that
// leads while the functions of Go kept by a failed commit fill a whole
// group is not held by their retries: when a commit ahead of its function
// fails, Do returns that failure (fail closed) instead of committing,
// failing and committing again, on its own goroutine and deaf to its
// context, for as long as the disk refuses; and that the kept functions
// are then retried after the retry delay, not at once and again.
func TestLeaderBehindKeptChangesFailsClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := newFakeDB()
		diskFull := errors.New("no space left on device")
		db.failOn = map[int]error{}
		for i := 1; i <= 50; i++ {
			db.failOn[i] = diskFull
		}
		w := New(db.update, Options{MaxGroup: 2, AsyncDelay: time.Hour, MaxRetryDelay: time.Hour})
		for _, name := range []string{"mark1", "mark2"} {
			if err := w.Go(put(name)); err != nil {
				t.Fatal(err)
			}
		}
		// A Sync leads the first commit, which fails and keeps both marks.
		if err := w.Sync(t.Context()); !errors.Is(err, diskFull) {
			t.Fatalf("Sync: %v, want the commit's failure", err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		err := w.Do(ctx, put("reserve"))
		if n := db.calls(); !errors.Is(err, diskFull) || n != 2 {
			t.Fatalf("Do behind a full group of kept changes: %v after %d commits, want the disk's failure after 2", err, n)
		}
		synctest.Wait()
		if n := db.calls(); n != 2 {
			t.Fatalf("%d commits once the Do returned, want 2: the kept changes wait for the retry delay", n)
		}
		db.mu.Lock()
		db.failOn = nil
		db.mu.Unlock()
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		db.mu.Lock()
		defer db.mu.Unlock()
		if db.data["mark1"] != 1 || db.data["mark2"] != 1 || db.data["reserve"] != 0 {
			t.Fatalf("committed %v, want both marks once and not the Do that failed", db.data)
		}
	})
}

// TestManyCallersFailingCommits is TestManyCallers with commits that fail
// (one in five while the disk is "full") and functions that panic: every
// function of Do that returned nil is committed once, one that returned
// an error never, every function accepted by Go once (kept across the
// failed commits until Close's, which succeeds); and no caller is left
// waiting (the test ends).
func TestManyCallersFailingCommits(t *testing.T) {
	db := newFakeDB()
	diskFull := errors.New("no space left on device")
	var full atomic.Bool
	full.Store(true)
	var rmu sync.Mutex
	rr := rand.New(rand.NewPCG(5, 5))
	db.fail = func() error {
		rmu.Lock()
		defer rmu.Unlock()
		if full.Load() && rr.IntN(5) == 0 {
			return diskFull
		}
		return nil
	}
	w := New(db.update, Options{MaxGroup: 4, AsyncDelay: 50 * time.Microsecond, MaxRetryDelay: 200 * time.Microsecond})
	want := manyCallers(t, w, 2, diskFull, true)
	full.Store(false)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	checkCommitted(t, db, want)
}

// TestCloseRacesRetries closes writers while the timer retries functions
// of Go whose commits fail half the time: Close waits for a retry under
// way and makes the last attempt itself, so each function is committed
// at most once, all of them when Close returns nil, and Do, Go and Sync
// after Close return ErrClosed.
func TestCloseRacesRetries(t *testing.T) {
	for round := range 200 {
		db := newFakeDB()
		r := rand.New(rand.NewPCG(uint64(round), 3))
		var rmu sync.Mutex
		db.fail = func() error {
			rmu.Lock()
			defer rmu.Unlock()
			if r.IntN(2) == 0 {
				return errors.New("no space left on device")
			}
			return nil
		}
		w := New(db.update, Options{MaxGroup: 2, AsyncDelay: time.Duration(round%3) * time.Microsecond, MaxRetryDelay: 20 * time.Microsecond})
		const n = 5
		for i := range n {
			if err := w.Go(put(fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
		rmu.Lock()
		wait := time.Duration(r.IntN(100)) * time.Microsecond
		rmu.Unlock()
		time.Sleep(wait)
		err := w.Close()
		if err2 := w.Go(put("late")); !errors.Is(err2, ErrClosed) {
			t.Fatalf("Go after Close: %v", err2)
		}
		if err2 := w.Do(t.Context(), put("late")); !errors.Is(err2, ErrClosed) {
			t.Fatalf("Do after Close: %v", err2)
		}
		if err2 := w.Sync(t.Context()); !errors.Is(err2, ErrClosed) {
			t.Fatalf("Sync after Close: %v", err2)
		}
		db.mu.Lock()
		for i := range n {
			got := db.data[fmt.Sprint(i)]
			if got > 1 || err == nil && got != 1 {
				t.Fatalf("round %d: %d committed %d times, Close: %v", round, i, got, err)
			}
		}
		if db.data["late"] != 0 {
			t.Fatalf("round %d: a change after Close was committed", round)
		}
		db.mu.Unlock()
	}
}
