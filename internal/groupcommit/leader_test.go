package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// goid returns the calling goroutine's id, read from its stack trace's
// first line ("goroutine 7 [running]:").
func goid() uint64 {
	var buf [64]byte
	s := strings.TrimPrefix(string(buf[:runtime.Stack(buf[:], false)]), "goroutine ")
	id, err := strconv.ParseUint(s[:strings.IndexByte(s, ' ')], 10, 64)
	if err != nil {
		panic(err)
	}
	return id
}

// putOn is put that also records, in *g, the goroutine it ran on.
func putOn(name string, g *atomic.Uint64) func(*fakeTx) error {
	return func(tx *fakeTx) error { g.Store(goid()); tx.put(name); return nil }
}

// TestLoneDoCommitsOnCallersGoroutine checks that a Do that finds no
// commit running runs its function, and the commit, on the caller's own
// goroutine: no hand-off to another goroutine and back.
func TestLoneDoCommitsOnCallersGoroutine(t *testing.T) {
	db := newFakeDB()
	var committer atomic.Uint64
	w := New(func(fn func(*fakeTx) error) error {
		committer.Store(goid())
		return db.update(fn)
	}, Options{})
	defer w.Close()
	for i := range 3 {
		var ran atomic.Uint64
		if err := w.Do(t.Context(), putOn(fmt.Sprint(i), &ran)); err != nil {
			t.Fatal(err)
		}
		if me := goid(); ran.Load() != me || committer.Load() != me {
			t.Fatalf("Do %d: function ran on goroutine %d and the commit on %d, want the caller's, %d", i, ran.Load(), committer.Load(), me)
		}
	}
}

// TestLeadPassesOn checks that when the leader's commit ends, its caller
// returns at once and the callers queued meanwhile commit together, led
// by one of them on its own goroutine, while the first leader is gone.
func TestLeadPassesOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := newFakeDB()
		w := New(db.update, Options{})
		defer w.Close()
		ctx := t.Context()

		first, release := holdLeader(t, w, db, "first")
		defer release()
		entered2, release2 := db.hold() // the next commit waits too
		defer release2()

		const n = 3
		callers := make([]atomic.Uint64, n) // goroutine of each caller
		ran := make([]atomic.Uint64, n)     // goroutine each function ran on
		errs := make(chan error, n)
		for i := range n {
			go func() {
				callers[i].Store(goid())
				errs <- w.Do(ctx, putOn(fmt.Sprint("w", i), &ran[i]))
			}()
		}
		waitQueued(t, w, n)
		release()
		<-entered2
		synctest.Wait()
		select {
		case err := <-first:
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatal("the first leader's caller had not returned while the next group committed")
		}
		release2()
		for range n {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		leader := ran[0].Load()
		isCaller := false
		for i := range n {
			if ran[i].Load() != leader {
				t.Fatalf("functions of one group ran on goroutines %d and %d", leader, ran[i].Load())
			}
			isCaller = isCaller || callers[i].Load() == leader
		}
		if !isCaller {
			t.Fatalf("the second group ran on goroutine %d, none of its callers'", leader)
		}
		db.mu.Lock()
		defer db.mu.Unlock()
		if got, want := groupSizes(db.groups), []int{1, n}; !slices.Equal(got, want) {
			t.Fatalf("group sizes %v, want %v", got, want)
		}
	})
}

// TestLeaderCommitsEarlierGroupsFirst checks that a caller handed the lead
// whose function is beyond the first MaxGroup queued commits the groups
// ahead of its own, and stops after its own.
func TestLeaderCommitsEarlierGroupsFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := newFakeDB()
		w := New(db.update, Options{MaxGroup: 2, AsyncDelay: time.Hour})
		defer w.Close()
		first, release := holdLeader(t, w, db, "first")
		defer release()
		for _, name := range []string{"a", "b", "c"} {
			if err := w.Go(put(name)); err != nil {
				t.Fatal(err)
			}
		}
		last := make(chan error, 1)
		go func() { last <- w.Do(t.Context(), put("d")) }()
		waitQueued(t, w, 4)
		if err := w.Go(put("e")); err != nil { // queued after d: not d's to commit
			t.Fatal(err)
		}
		release()
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if err := <-last; err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got, want := db.groupsString(), "[[first] [a b] [c d]]"; got != want {
			t.Fatalf("groups %s, want %s (e waits for the timer)", got, want)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if got, want := db.groupsString(), "[[first] [a b] [c d] [e]]"; got != want {
			t.Fatalf("groups %s after the async delay, want %s", got, want)
		}
	})
}

// TestAsyncAfterALeader checks that functions queued by Go while a commit
// runs are, once it ends, committed by the timer after the async delay if
// no Do comes, or ride the next Do (which stops the timer).
func TestAsyncAfterALeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = time.Second
		db := newFakeDB()
		w := New(db.update, Options{AsyncDelay: delay})
		defer w.Close()
		first, release := holdLeader(t, w, db, "reserve-1")
		defer release()
		if err := w.Go(put("finish-1")); err != nil {
			t.Fatal(err)
		}
		release()
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		time.Sleep(delay - time.Nanosecond)
		synctest.Wait()
		if got, want := db.groupsString(), "[[reserve-1]]"; got != want {
			t.Fatalf("before the async delay: groups %s, want %s", got, want)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if got, want := db.groupsString(), "[[reserve-1] [finish-1]]"; got != want {
			t.Fatalf("after the async delay: groups %s, want %s", got, want)
		}

		// Carried by the next Do, on its caller's goroutine.
		if err := w.Go(put("finish-2")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(delay / 2)
		var ran atomic.Uint64
		if err := w.Do(t.Context(), putOn("reserve-3", &ran)); err != nil {
			t.Fatal(err)
		}
		if ran.Load() != goid() {
			t.Fatal("a lone Do did not commit on its caller's goroutine")
		}
		time.Sleep(2 * delay)
		synctest.Wait()
		if got, want := db.groupsString(), "[[reserve-1] [finish-1] [finish-2 reserve-3]]"; got != want {
			t.Fatalf("groups %s, want %s (one commit for finish-2 and reserve-3, and no timer's commit after it)", got, want)
		}
	})
}

// TestHookPanicPassesLead checks that a hook that panics on a leader's
// goroutine neither loses the commit's results nor stops the Writer: the
// panic reaches the leader's caller after the lead passed on.
func TestHookPanicPassesLead(t *testing.T) {
	db := newFakeDB()
	var once atomic.Bool
	w := New(db.update, Options{OnCommit: func(int, time.Duration, error) {
		if once.CompareAndSwap(false, true) {
			panic("hook")
		}
	}})
	defer w.Close()
	func() {
		defer func() {
			if p := recover(); p != "hook" {
				t.Fatalf("recovered %v, want the hook's panic", p)
			}
		}()
		_ = w.Do(t.Context(), put("a"))
		t.Fatal("Do returned; want the hook's panic")
	}()
	if err := w.Do(t.Context(), put("b")); err != nil {
		t.Fatal(err)
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.data["a"] != 1 || db.data["b"] != 1 {
		t.Fatalf("committed %v, want a and b once", db.data)
	}
}

// TestManyCallers runs many callers of Do, Go and Sync at once, some with
// contexts that end, some with functions that fail, in small groups with a
// short async delay (run it with -race), and checks that every change is
// committed exactly as often as its caller was told.
func TestManyCallers(t *testing.T) {
	db := newFakeDB()
	w := New(db.update, Options{MaxGroup: 8, AsyncDelay: 50 * time.Microsecond})
	want := manyCallers(t, w, 1, nil, false)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	checkCommitted(t, db, want)
	for _, g := range db.groups {
		if len(g) > 8 {
			t.Fatalf("a group of %d, above MaxGroup", len(g))
		}
	}
}

// manyCallers runs 16 callers of Do, Go and Sync on w at once, 150 rounds
// each, drawn from seed: one Do in four with a context that ends soon,
// one in eight whose function fails, and, if panics, one in eight whose
// function panics. A Do or Sync may fail with diskErr, if not nil. It
// returns how often each change must be committed once w is closed.
func manyCallers(t *testing.T, w *Writer[*fakeTx], seed uint64, diskErr error, panics bool) map[string]int {
	t.Helper()
	const callers, rounds = 16, 150
	var (
		mu   sync.Mutex
		want = map[string]int{} // name -> times it must be committed
	)
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(c), seed))
			for i := range rounds {
				name := fmt.Sprintf("c%d-%d", c, i)
				ctx, cancel := context.WithCancel(context.Background())
				if r.IntN(4) == 0 {
					time.AfterFunc(time.Duration(r.IntN(50))*time.Microsecond, cancel)
				}
				fn := put(name)
				bad := r.IntN(8)
				if bad == 1 && !panics {
					bad = 2
				}
				switch bad {
				case 0:
					fn = func(tx *fakeTx) error { tx.put(name); return errors.New("bad") }
				case 1:
					fn = func(tx *fakeTx) error { tx.put(name); panic("bad") }
				}
				err := w.Do(ctx, fn)
				cancel()
				mu.Lock()
				switch {
				case err == nil && bad > 1:
					want[name] = 1
				case err != nil && bad == 0 && err.Error() == "bad":
				case err != nil && bad == 1 && strings.Contains(err.Error(), "panicked"):
				case errors.Is(err, context.Canceled), diskErr != nil && errors.Is(err, diskErr):
				default:
					t.Errorf("Do %s (failing: %v): %v", name, bad, err)
				}
				mu.Unlock()
				if err := w.Go(put(name + "-go")); err != nil {
					t.Error(err)
				}
				mu.Lock()
				want[name+"-go"] = 1
				mu.Unlock()
				if r.IntN(16) == 0 {
					if err := w.Sync(context.Background()); err != nil && (diskErr == nil || !errors.Is(err, diskErr)) {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	return want
}

// checkCommitted checks that db committed every change exactly as often as
// want says, and nothing else. db.mu is held.
func checkCommitted(t *testing.T, db *fakeDB, want map[string]int) {
	t.Helper()
	for name, n := range db.data {
		if want[name] != n {
			t.Errorf("%s committed %d times, want %d", name, n, want[name])
		}
	}
	for name, n := range want {
		if db.data[name] != n {
			t.Errorf("%s committed %d times, want %d", name, db.data[name], n)
		}
	}
}
