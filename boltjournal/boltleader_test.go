package boltjournal_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/boltjournal"
	"github.com/idemgo/idem/idemstore"
)

// TestBoltStoreReserveBehindKeptMarksFailsClosed checks that a Reserve
// made while more finish marks than a commit carries are kept by failed
// commits returns ErrJournalWrite at once: it does not lead commit after
// failing commit of the marks ahead of it, deaf to its context, for as
// long as the journal cannot be written, and the marks are written once
// it can be.
func TestBoltStoreReserveBehindKeptMarksFailsClosed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	var failed atomic.Int32
	var restore func()
	s, err := boltjournal.OpenHoldingMarks(path, &boltjournal.Options{MaxGroup: 2, ScrubDelay: -1,
		OnCommit: func(_ int, _ time.Duration, err error) {
			// The journal comes back after 10 failed commits, which ends
			// the retries if nothing else does.
			if err != nil && failed.Add(1) == 10 {
				restore()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	var keys []string
	for i := range 4 {
		op := mustReserve(t, s, newOp(fmt.Sprintf("key-%d", i)))
		keys = append(keys, op.Key)
	}
	// The path no longer names the journal: every commit fails.
	if err := os.Rename(path, path+".away"); err != nil {
		t.Fatal(err)
	}
	restore = func() {
		if err := os.Rename(path+".away", path); err != nil {
			t.Error(err)
		}
	}
	for _, k := range keys {
		if err := s.Finish(ctx, k, idemstore.Outcome{State: idemstore.StateSucceeded, Status: 200, Sent: 1}); err != nil {
			t.Fatal(err)
		}
	}
	// A Get waits for the marks: its Sync leads a commit that fails and
	// keeps them.
	if _, err := s.Get(ctx, keys[0]); !errors.Is(err, idemstore.ErrJournalWrite) {
		t.Fatalf("Get with the journal away = %v, want ErrJournalWrite", err)
	}
	_, _, err = s.Reserve(ctx, newOp("after"))
	if n := failed.Load(); !errors.Is(err, idemstore.ErrJournalWrite) || n > 3 {
		t.Fatalf("Reserve behind kept marks = %v after %d failed commits, want ErrJournalWrite after at most 3", err, n)
	}
	restore()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s2 := openBolt(t, path)
	for _, k := range keys {
		if op, err := s2.Get(ctx, k); err != nil || op.State != idemstore.StateSucceeded || op.Attempts != 1 {
			t.Errorf("%s: %v, %d attempts, %v; want succeeded once", k, op.State, op.Attempts, err)
		}
	}
	if _, err := s2.Get(ctx, "after"); !errors.Is(err, idemstore.ErrNotFound) {
		t.Errorf("Get(after) = %v, want ErrNotFound: its Reserve failed", err)
	}
}
