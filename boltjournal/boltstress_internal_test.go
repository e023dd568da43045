package boltjournal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/groupcommit"
	bolt "go.etcd.io/bbolt"
)

// errInjected is the failure of a commit the stress test makes fail.
var errInjected = errors.New("injected commit failure")

// TestBoltStoreStressFailingCommits runs many callers of Reserve, Attempt,
// Renew, Finish and Get at once, in small groups, with contexts that end,
// while commits keep failing, so that changes are dropped from the queue,
// groups run again without a change that failed (a renewal by another
// owner), reservations fail closed behind kept marks, and finish marks
// and reservations are reused while others are kept for a retry. It
// checks, after Close and a reopen, what the store promised: a Reserve
// that returned an error left no record, one that returned created the
// record with its own request, and every accepted Attempt and Finish was
// written exactly once with its own values (a mark or a reservation
// reused too early shows as another key's values or a damaged record, a
// mark dropped as a pending record, one applied twice as an extra
// attempt).
//
// The commits fail in two ways: the journal's path is taken away and
// given back (a commit that starts meanwhile fails before its changes
// run), or one commit in four fails after its changes ran, as a full disk
// fails bbolt's write (the transaction rolls back).
func TestBoltStoreStressFailingCommits(t *testing.T) {
	t.Run("path away", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "journal.db")
		var stop atomic.Bool
		var faults sync.WaitGroup
		defer faults.Wait()
		defer stop.Store(true)
		stressFailingCommits(t, path, nil, func() {
			faults.Go(func() {
				r := mathrand.New(mathrand.NewPCG(99, 1))
				for !stop.Load() {
					if err := os.Rename(path, path+".away"); err != nil {
						t.Error(err)
						return
					}
					time.Sleep(time.Duration(r.IntN(100)) * time.Microsecond)
					if err := os.Rename(path+".away", path); err != nil {
						t.Error(err)
						return
					}
					time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond)
				}
			})
		}, func() { stop.Store(true); faults.Wait() })
	})
	t.Run("after the changes ran", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "journal.db")
		var mu sync.Mutex
		r := mathrand.New(mathrand.NewPCG(98, 1))
		var on atomic.Bool
		stressFailingCommits(t, path, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return on.Load() && r.IntN(4) == 0
		}, func() { on.Store(true) }, func() { on.Store(false) })
	})
}

// stressFailingCommits is TestBoltStoreStressFailingCommits on a journal
// at path whose commits fail after their changes ran when fail says so
// (nil: never). start begins the faults once the store is open; stop
// ends them, leaving the journal writable.
func stressFailingCommits(t *testing.T, path string, fail func() bool, start, stop func()) {
	var failedCommits atomic.Int32
	s, err := Open(path, &Options{MaxGroup: 4, ScrubDelay: -1, OnCommit: func(_ int, _ time.Duration, err error) {
		if err != nil {
			failedCommits.Add(1)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if fail != nil {
		// The same writer, with commits that roll back after their
		// changes ran when fail says so. No scrubber runs to see s.w
		// change.
		old := s.w
		s.w = groupcommit.New(func(fn func(*bolt.Tx) error) error {
			return s.f.Update(func(tx *bolt.Tx) error {
				if err := fn(tx); err != nil {
					return err
				}
				if fail() {
					return errInjected
				}
				return nil
			})
		}, groupcommit.Options{MaxGroup: 4, Recover: s.f.Corrupt, OnCommit: s.o.OnCommit})
		if err := old.Close(); err != nil {
			t.Fatal(err)
		}
	}
	type want struct {
		reserved bool
		body     []byte
		attempts int
		finished bool
	}
	const callers, each = 12, 50
	wants := make([][]want, callers)
	now := time.Now()
	start()
	var wg sync.WaitGroup
	for c := range callers {
		wants[c] = make([]want, each)
		wg.Go(func() {
			r := mathrand.New(mathrand.NewPCG(uint64(c), 7))
			for i := range each {
				n := c*each + i
				w := &wants[c][i]
				key := fmt.Sprintf("k-%05d", n)
				size := 10 + r.IntN(1500)
				switch r.IntN(12) {
				case 0:
					size = 20 << 10 // inline, larger than a scratch value
				case 1:
					size = 40 << 10 // stored apart
				}
				op := idemstore.Operation{
					Key: key, Method: http.MethodPost, URL: fmt.Sprint("http://h/", n), Owner: "o",
					State: idemstore.StatePending, Created: now, Updated: now, LeaseUntil: now.Add(time.Hour),
					Header: http.Header{"X-N": {fmt.Sprint(n)}},
					Body:   bytes.Repeat([]byte{byte('a' + n%26)}, size),
				}
				ctx, cancel := context.WithCancel(context.Background())
				if r.IntN(4) == 0 {
					time.AfterFunc(time.Duration(r.IntN(200))*time.Microsecond, cancel)
				}
				_, created, err := s.Reserve(ctx, op)
				cancel()
				switch {
				case err == nil && created:
					w.reserved, w.body = true, op.Body
				case err == nil:
					t.Errorf("Reserve(%s): not created", key)
					return
				case errors.Is(err, idemstore.ErrJournalWrite) || errors.Is(err, errInjected) || errors.Is(err, context.Canceled):
					continue
				default:
					t.Errorf("Reserve(%s): %v", key, err)
					return
				}
				for range r.IntN(3) {
					if err := s.Attempt(context.Background(), key, idemstore.Attempt{Sent: 1, Status: 503, Reason: "503", At: now}); err != nil {
						t.Errorf("Attempt(%s): %v", key, err)
						return
					}
					w.attempts++
				}
				if r.IntN(3) == 0 {
					// A renewal by another owner fails in its group, which
					// is then run again without it: the marks it carried
					// ran in a transaction that rolled back.
					l := idemstore.Lease{Owner: "other", At: now, Until: now.Add(time.Minute)}
					err := s.Renew(context.Background(), key, l)
					if !errors.Is(err, idemstore.ErrLeaseLost) && !errors.Is(err, idemstore.ErrJournalWrite) && !errors.Is(err, errInjected) {
						t.Errorf("Renew(%s) by another owner: %v", key, err)
					}
				}
				if r.IntN(3) > 0 {
					o := idemstore.Outcome{State: idemstore.StateSucceeded, Status: 200 + n%100, Err: fmt.Sprint("e", n), Sent: 1, URL: fmt.Sprint("http://h/", n), At: now}
					if err := s.Finish(context.Background(), key, o); err != nil {
						t.Errorf("Finish(%s): %v", key, err)
						return
					}
					w.finished = true
				}
				if r.IntN(8) == 0 {
					_, err := s.Get(context.Background(), key)
					if err != nil && !errors.Is(err, idemstore.ErrJournalWrite) && !errors.Is(err, errInjected) {
						t.Errorf("Get(%s): %v", key, err)
					}
				}
			}
		})
	}
	wg.Wait()
	stop()
	if err := s.Close(); err != nil {
		t.Fatalf("Close with the journal writable again: %v", err)
	}
	var reserved, failed int
	for c := range callers {
		for _, w := range wants[c] {
			if w.reserved {
				reserved++
			}
		}
	}
	failed = int(failedCommits.Load())
	if failed == 0 || reserved == 0 || reserved == callers*each {
		t.Fatalf("%d of %d reserved, %d failed commits: the test proves nothing", reserved, callers*each, failed)
	}
	s2, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	ctx := t.Context()
	for c := range callers {
		for i, w := range wants[c] {
			n := c*each + i
			key := fmt.Sprintf("k-%05d", n)
			op, err := s2.Get(ctx, key)
			if !w.reserved {
				if !errors.Is(err, idemstore.ErrNotFound) {
					t.Errorf("%s: its Reserve failed, but Get = %v, %v", key, op.State, err)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s: reserved, but Get: %v", key, err)
				continue
			}
			switch {
			case !w.finished:
				if op.State != idemstore.StatePending || op.Attempts != w.attempts || len(op.History) != w.attempts ||
					!bytes.Equal(op.Body, w.body) || op.Header.Get("X-N") != fmt.Sprint(n) {
					t.Errorf("%s: %v with %d attempts (%d in history), body of %d bytes, header %v; want pending with %d attempts and its own request",
						key, op.State, op.Attempts, len(op.History), len(op.Body), op.Header, w.attempts)
				}
			case op.State != idemstore.StateSucceeded || op.Attempts != w.attempts+1 || op.LastStatus != 200+n%100 ||
				op.LastError != fmt.Sprint("e", n) || op.URL != fmt.Sprint("http://h/", n) || op.Body != nil:
				t.Errorf("%s: %v with %d attempts, status %d, error %q, URL %s, body of %d bytes; want succeeded with %d attempts, status %d, e%d",
					key, op.State, op.Attempts, op.LastStatus, op.LastError, op.URL, len(op.Body), w.attempts+1, 200+n%100, n)
			}
		}
	}
	t.Logf("%d of %d reserved, %d failed commits", reserved, callers*each, failed)
}
