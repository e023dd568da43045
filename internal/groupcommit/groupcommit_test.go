package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeDB is a transactional map: a transaction's writes become visible only
// if its function and its commit succeed.
type fakeDB struct {
	mu        sync.Mutex
	data      map[string]int
	groups    [][]string    // names written by each committed transaction
	failOn    map[int]error // commit number (from 1) -> its error
	fail      func() error  // if set, the error of a commit, or nil
	gate      chan struct{}
	entered   chan struct{}
	callCount int
}

type fakeTx struct{ writes []string }

func (tx *fakeTx) put(name string) { tx.writes = append(tx.writes, name) }

func newFakeDB() *fakeDB { return &fakeDB{data: map[string]int{}} }

func (db *fakeDB) update(fn func(*fakeTx) error) error {
	db.mu.Lock()
	db.callCount++
	gate, entered := db.gate, db.entered
	db.gate, db.entered = nil, nil
	db.mu.Unlock()
	if entered != nil {
		close(entered)
		<-gate
	}
	tx := &fakeTx{}
	if err := fn(tx); err != nil {
		return err
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if err := db.failOn[db.callCount]; err != nil {
		return err
	}
	if db.fail != nil {
		if err := db.fail(); err != nil {
			return err
		}
	}
	for _, w := range tx.writes {
		db.data[w]++
	}
	db.groups = append(db.groups, tx.writes)
	return nil
}

// hold makes the next commit block until the returned release is called;
// entered is closed once that commit has started. Calling release again
// does nothing, so a test may also defer it, to free the writer if it
// stops early.
func (db *fakeDB) hold() (entered chan struct{}, release func()) {
	db.mu.Lock()
	defer db.mu.Unlock()
	gate, entered := make(chan struct{}), make(chan struct{})
	db.gate, db.entered = gate, entered
	var once sync.Once
	return entered, func() { once.Do(func() { close(gate) }) }
}

// count returns how many times name was committed.
func (db *fakeDB) count(name string) int {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.data[name]
}

// calls returns how many commits db was asked for, failed ones included.
func (db *fakeDB) calls() int {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.callCount
}

// groupsString returns the names written by each committed transaction,
// as fmt prints them: "[[a b] [c]]".
func (db *fakeDB) groupsString() string {
	db.mu.Lock()
	defer db.mu.Unlock()
	return fmt.Sprint(db.groups)
}

// holdLeader starts a Do of put(name) on its own goroutine and returns
// once it leads a commit that db holds: the channel of that Do's result,
// and the release of its commit, which the caller defers too (after
// deferring w.Close), to free the writer if the test stops early.
func holdLeader(t *testing.T, w *Writer[*fakeTx], db *fakeDB, name string) (<-chan error, func()) {
	entered, release := db.hold()
	first := make(chan error, 1)
	go func() { first <- w.Do(t.Context(), put(name)) }()
	<-entered
	return first, release
}

func put(name string) func(*fakeTx) error {
	return func(tx *fakeTx) error { tx.put(name); return nil }
}

// waitQueued waits, inside a synctest bubble, until every other goroutine
// of the bubble is blocked, and checks that n functions are then queued
// behind the running group.
func waitQueued[T any](t *testing.T, w *Writer[T], n int) {
	t.Helper()
	synctest.Wait()
	w.mu.Lock()
	q := len(w.queue)
	w.mu.Unlock()
	if q != n {
		t.Fatalf("%d functions queued, want %d", q, n)
	}
}

func TestGroupTakesEverythingQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := newFakeDB()
		w := New(db.update, Options{})
		defer w.Close()
		ctx := t.Context()

		first, release := holdLeader(t, w, db, "first")
		defer release()

		const n = 50
		errs := make(chan error, n)
		for i := range n {
			go func() { errs <- w.Do(ctx, put(fmt.Sprint("w", i))) }()
		}
		waitQueued(t, w, n)
		release()
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		for range n {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		db.mu.Lock()
		defer db.mu.Unlock()
		if len(db.groups) != 2 || len(db.groups[1]) != n {
			t.Fatalf("got %d commits (sizes %v), want 2 with the second holding %d", len(db.groups), groupSizes(db.groups), n)
		}
	})
}

func TestMaxGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := newFakeDB()
		w := New(db.update, Options{MaxGroup: 3})
		defer w.Close()
		entered, release := db.hold()
		defer release()
		if err := w.Go(put("first")); err != nil {
			t.Fatal(err)
		}
		<-entered
		for i := range 7 {
			if err := w.Go(put(fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
		release()
		if err := w.Sync(t.Context()); err != nil {
			t.Fatal(err)
		}
		db.mu.Lock()
		defer db.mu.Unlock()
		if got, want := groupSizes(db.groups), []int{1, 3, 3, 1}; !slices.Equal(got, want) {
			t.Fatalf("group sizes %v, want %v", got, want)
		}
	})
}

func TestFailingFunctionDoesNotFailOthers(t *testing.T) {
	for _, tc := range []struct {
		name string
		bad  func(*fakeTx) error
	}{
		{"error", func(tx *fakeTx) error { tx.put("partial"); return errors.New("bad input") }},
		{"panic", func(tx *fakeTx) error { tx.put("partial"); panic("boom") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				db := newFakeDB()
				w := New(db.update, Options{})
				defer w.Close()
				ctx := t.Context()
				_, release := holdLeader(t, w, db, "first")
				defer release()

				results := make([]chan error, 3)
				fns := []func(*fakeTx) error{put("a"), tc.bad, put("b")}
				for i, fn := range fns {
					results[i] = make(chan error, 1)
					go func() { results[i] <- w.Do(ctx, fn) }()
					waitQueued(t, w, i+1)
				}
				release()
				if err := <-results[0]; err != nil {
					t.Errorf("a: %v", err)
				}
				if err := <-results[1]; err == nil {
					t.Error("bad function: got nil error")
				}
				if err := <-results[2]; err != nil {
					t.Errorf("b: %v", err)
				}
				db.mu.Lock()
				defer db.mu.Unlock()
				if db.data["a"] != 1 || db.data["b"] != 1 || db.data["partial"] != 0 {
					t.Fatalf("committed %v, want a and b once and no partial write", db.data)
				}
			})
		})
	}
}

func TestCommitFailureReachesEveryCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := newFakeDB()
		asyncErrs := make(chan error, 1)
		w := New(db.update, Options{OnAsyncError: func(err error) { asyncErrs <- err }})
		defer w.Close()
		ctx := t.Context()
		first, release := holdLeader(t, w, db, "first")
		defer release()

		diskFull := errors.New("no space left on device")
		const n = 5
		errs := make(chan error, n)
		for i := range n {
			go func() { errs <- w.Do(ctx, put(fmt.Sprint(i))) }()
		}
		waitQueued(t, w, n)
		if err := w.Go(put("async")); err != nil {
			t.Fatal(err)
		}
		db.mu.Lock()
		db.failOn = map[int]error{2: diskFull} // the group queued behind "first"
		db.mu.Unlock()
		release()
		if err := <-first; err != nil {
			t.Fatalf("first commit: %v", err)
		}
		for range n {
			if err := <-errs; !errors.Is(err, diskFull) {
				t.Errorf("caller in the failed group: got %v, want the commit error", err)
			}
		}
		synctest.Wait()
		select {
		case err := <-asyncErrs:
			if !errors.Is(err, diskFull) {
				t.Errorf("async function in the failed group: got %v, want the commit error", err)
			}
		default:
			t.Error("async function in the failed group: no error reached OnAsyncError")
		}
		if err := w.Do(ctx, put("next")); err != nil {
			t.Fatalf("the group after a failed commit: %v", err)
		}
		db.mu.Lock()
		defer db.mu.Unlock()
		// The async function was kept and rode the next commit; the
		// callers of Do in the failed group were told, and their changes
		// are gone.
		if len(db.data) != 3 || db.data["first"] != 1 || db.data["next"] != 1 || db.data["async"] != 1 {
			t.Fatalf("committed %v, want first, async and next once each", db.data)
		}
	})
}

func TestAsyncKeptUntilACommitSucceeds(t *testing.T) {
	db := newFakeDB()
	diskFull := errors.New("no space left on device")
	db.failOn = map[int]error{1: diskFull, 2: diskFull, 3: diskFull}
	var mu sync.Mutex
	var reported []error
	w := New(db.update, Options{AsyncDelay: -1, MaxRetryDelay: time.Millisecond, OnAsyncError: func(err error) {
		mu.Lock()
		reported = append(reported, err)
		mu.Unlock()
	}})
	defer w.Close()
	if err := w.Go(put("mark")); err != nil {
		t.Fatal(err)
	}
	// Sync reports the failure instead of waiting for a disk that is full.
	for {
		err := w.Sync(t.Context())
		if err == nil {
			break
		}
		if !errors.Is(err, diskFull) {
			t.Fatalf("Sync: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.data["mark"] != 1 || db.callCount != 4 {
		t.Fatalf("after three failed commits: committed %v in %d commits, want mark in the 4th", db.data, db.callCount)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reported) != 3 || !errors.Is(reported[0], diskFull) {
		t.Fatalf("OnAsyncError got %v, want the three commit errors", reported)
	}
}

func TestCloseReportsChangesItCouldNotWrite(t *testing.T) {
	db := newFakeDB()
	diskFull := errors.New("no space left on device")
	db.failOn = map[int]error{}
	for i := range 100 {
		db.failOn[i+1] = diskFull
	}
	w := New(db.update, Options{AsyncDelay: time.Hour, MaxRetryDelay: time.Hour})
	if err := w.Go(put("mark")); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(t.Context()); !errors.Is(err, diskFull) {
		t.Fatalf("Sync = %v, want the commit error", err)
	}
	if err := w.Close(); !errors.Is(err, diskFull) {
		t.Fatalf("Close with a change that still cannot be written = %v, want the commit error", err)
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if len(db.data) != 0 {
		t.Fatalf("committed %v on a full disk", db.data)
	}
}

func groupSizes(groups [][]string) []int {
	var s []int
	for _, g := range groups {
		s = append(s, len(g))
	}
	return s
}

func TestCloseFlushesAndRefuses(t *testing.T) {
	db := newFakeDB()
	w := New(db.update, Options{})
	for i := range 10 {
		if err := w.Go(put(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	db.mu.Lock()
	if len(db.data) != 10 {
		t.Errorf("committed %d of 10 queued functions before Close returned", len(db.data))
	}
	db.mu.Unlock()
	ctx := context.Background()
	for name, err := range map[string]error{
		"Do":    w.Do(ctx, put("late")),
		"Go":    w.Go(put("late")),
		"Sync":  w.Sync(ctx),
		"Close": w.Close(),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: got %v, want ErrClosed", name, err)
		}
	}
}

// TestCancelWhileQueued checks that a function whose Do returned because
// its context ended while it was queued never runs: boltjournal reuses a
// Reserve's change once Do returns (docs/DESIGN.md, "Allocation
// invariants").
func TestCancelWhileQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := newFakeDB()
		w := New(db.update, Options{})
		defer w.Close()
		_, release := holdLeader(t, w, db, "first")
		defer release()
		ctx, cancel := context.WithCancel(t.Context())
		res := make(chan error, 1)
		go func() { res <- w.Do(ctx, put("cancelled")) }()
		waitQueued(t, w, 1)
		cancel()
		synctest.Wait()
		select {
		case err := <-res:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("got %v, want context.Canceled", err)
			}
		default:
			t.Fatal("Do did not return when its context ended while its function was queued")
		}
		release()
		if err := w.Do(t.Context(), put("after")); err != nil {
			t.Fatal(err)
		}
		db.mu.Lock()
		defer db.mu.Unlock()
		if db.data["cancelled"] != 0 {
			t.Fatal("a function cancelled while queued was committed")
		}
	})
}

func TestSyncWaitsForAsync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := newFakeDB()
		w := New(db.update, Options{})
		defer w.Close()
		entered, release := db.hold()
		defer release()
		if err := w.Go(put("a")); err != nil {
			t.Fatal(err)
		}
		<-entered
		if err := w.Go(put("b")); err != nil {
			t.Fatal(err)
		}
		synced := make(chan error, 1)
		go func() { synced <- w.Sync(t.Context()) }()
		synctest.Wait() // Sync is waiting, or returned
		select {
		case <-synced:
			t.Fatal("Sync returned while a queued function had not committed")
		default:
		}
		release()
		if err := <-synced; err != nil {
			t.Fatal(err)
		}
		db.mu.Lock()
		defer db.mu.Unlock()
		if db.data["a"] != 1 || db.data["b"] != 1 {
			t.Fatalf("after Sync: %v", db.data)
		}
	})
}

// TestAsyncRidesNextDurableCommit checks that functions queued with Go
// wait for the next Do and share its commit, and that without one they are
// committed on their own once the async delay is over.
func TestAsyncRidesNextDurableCommit(t *testing.T) {
	db := newFakeDB()
	w := New(db.update, Options{AsyncDelay: time.Hour})
	defer w.Close()
	if err := w.Go(put("finish-1")); err != nil {
		t.Fatal(err)
	}
	if err := w.Go(put("finish-2")); err != nil {
		t.Fatal(err)
	}
	if err := w.Do(context.Background(), put("reserve-3")); err != nil {
		t.Fatal(err)
	}
	if got, want := db.groupsString(), "[[finish-1 finish-2 reserve-3]]"; got != want {
		t.Fatalf("groups = %s, want %s (one commit)", got, want)
	}

	// Sync carries queued Go functions too.
	if err := w.Go(put("finish-4")); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := db.count("finish-4"); n != 1 {
		t.Fatalf("finish-4 committed %d times after Sync, want 1", n)
	}
}

// TestAsyncCommittedAfterDelay checks that a lone function queued with Go
// is committed once the async delay is over, and not before.
func TestAsyncCommittedAfterDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = time.Second
		db := newFakeDB()
		w := New(db.update, Options{AsyncDelay: delay})
		defer w.Close()
		if err := w.Go(put("finish")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(delay - time.Nanosecond)
		synctest.Wait()
		if n := db.count("finish"); n != 0 {
			t.Fatalf("a lone Go function was committed %d times before the async delay was over", n)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if n := db.count("finish"); n != 1 {
			t.Fatalf("a lone Go function was committed %d times once the async delay was over, want 1", n)
		}
	})
}

// BenchmarkHandoff measures what the writer itself costs a caller: Do of
// a function that does nothing, into a commit that does nothing, from 1
// and 32 goroutines, and Go (the asynchronous handoff) alongside Do.
func BenchmarkHandoff(b *testing.B) {
	noop := func(*fakeTx) error { return nil }
	update := func(fn func(*fakeTx) error) error { return fn(&fakeTx{}) }
	for _, par := range []int{1, 32} {
		b.Run(fmt.Sprintf("Do/goroutines=%d", par), func(b *testing.B) {
			w := New(update, Options{})
			defer w.Close()
			b.ReportAllocs()
			b.SetParallelism(par)
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					if err := w.Do(ctx, noop); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		b.Run(fmt.Sprintf("DoGo/goroutines=%d", par), func(b *testing.B) {
			w := New(update, Options{})
			defer w.Close()
			b.ReportAllocs()
			b.SetParallelism(par)
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					if err := w.Do(ctx, noop); err != nil {
						b.Error(err)
						return
					}
					if err := w.Go(noop); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// TestSteadyDoAllocatesNothing checks that a caller committing one change
// after another costs the writer no allocation: the queue's arrays are
// reused from group to group, and Do's items come from a pool.
func TestSteadyDoAllocatesNothing(t *testing.T) {
	var tx struct{}
	w := New(func(fn func(*struct{}) error) error { return fn(&tx) }, Options{})
	defer w.Close()
	ctx := context.Background()
	fn := func(*struct{}) error { return nil }
	for range 10 { // warm the pool and the queue's arrays
		if err := w.Do(ctx, fn); err != nil {
			t.Fatal(err)
		}
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if err := w.Do(ctx, fn); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Do allocates %v times per call, want 0", allocs)
	}
}
