package groupcommit

import (
	"context"
	"errors"
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
		calls := func() int {
			db.mu.Lock()
			defer db.mu.Unlock()
			return db.callCount
		}
		if n := calls(); !errors.Is(err, diskFull) || n != 2 {
			t.Fatalf("Do behind a full group of kept changes: %v after %d commits, want the disk's failure after 2", err, n)
		}
		synctest.Wait()
		if n := calls(); n != 2 {
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
