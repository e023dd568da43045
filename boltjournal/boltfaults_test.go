package boltjournal_test

// Tests of the file system failing under the journal: a read-only
// mount, a full disk, the file removed while open.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/idemgo/idem/boltjournal"
	"github.com/idemgo/idem/idemstore"
)

// mount mounts source at dir, or skips the test where mounting is not
// permitted (not root, no CAP_SYS_ADMIN). A remount changes an existing
// mount and leaves its unmounting to the first call.
func mount(t *testing.T, source, dir, fstype string, flags uintptr, data string) {
	t.Helper()
	if err := syscall.Mount(source, dir, fstype, flags, data); err != nil {
		t.Skipf("cannot mount %q here (%v); this fault needs root", source, err)
	}
	if flags&syscall.MS_REMOUNT != 0 {
		return
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

func TestBoltStoreReadOnly(t *testing.T) {
	// Root ignores file modes, so the journal sits on a read-only bind
	// mount of its directory: the kernel refuses the write, as it would
	// for anyone.
	dir, ro := t.TempDir(), t.TempDir()
	journalWith(t, filepath.Join(dir, "journal.db"), "k1")
	mount(t, dir, ro, "", syscall.MS_BIND, "")
	mount(t, "", ro, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY, "")

	for _, name := range []string{"journal.db", "new.db"} {
		s, err := boltjournal.Open(filepath.Join(ro, name), nil)
		if err == nil {
			s.Close()
			t.Fatalf("%s: opened a journal on a read-only file system", name)
		}
		if !errors.Is(err, idemstore.ErrJournalWrite) {
			t.Fatalf("%s: got %v, want ErrJournalWrite", name, err)
		}
	}
}

func TestBoltStoreDiskFull(t *testing.T) {
	// A small tmpfs fills up during a commit: the reserving caller gets
	// ErrJournalWrite, and every record committed before survives.
	dir := t.TempDir()
	mount(t, "tmpfs", dir, "tmpfs", 0, "size=1m")
	path := filepath.Join(dir, "journal.db")
	s, err := boltjournal.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	var committed []string
	var full error
	for i := 0; i < 100 && full == nil; i++ {
		op := newOp(fmt.Sprint("key-", i))
		op.Body = bytes.Repeat([]byte{byte(i)}, 64*1024)
		if _, _, err := s.Reserve(ctx, op); err != nil {
			full = err
			break
		}
		committed = append(committed, op.Key)
	}
	if !errors.Is(full, idemstore.ErrJournalWrite) {
		t.Fatalf("filling a 1 MiB file system: got %v after %d records, want ErrJournalWrite", full, len(committed))
	}
	if len(committed) == 0 {
		t.Fatal("no record fitted at all")
	}
	for _, k := range committed {
		if _, err := s.Get(ctx, k); err != nil {
			t.Errorf("Get(%s) after a failed commit: %v", k, err)
		}
	}
	if err := s.Close(); err != nil && !errors.Is(err, idemstore.ErrJournalWrite) {
		t.Fatalf("Close: %v", err)
	}
	s2 := openBolt(t, path)
	for _, k := range committed {
		if _, err := s2.Get(ctx, k); err != nil {
			t.Errorf("Get(%s) after reopen: %v", k, err)
		}
	}
	s2.Close()
	checkFile(t, path)
}

func TestBoltStoreRemovedWhileOpen(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remove func(dir, path string) error
	}{
		{"file unlinked", func(_, path string) error { return os.Remove(path) }},
		{"directory removed", func(dir, _ string) error { return os.RemoveAll(dir) }},
		{"file replaced", func(_, path string) error {
			if err := os.Rename(path, path+".old"); err != nil {
				return err
			}
			return os.WriteFile(path, nil, 0o600)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "journal")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "journal.db")
			s := openBolt(t, path)
			ctx := t.Context()
			mustReserve(t, s, newOp("before"))
			if err := tc.remove(dir, path); err != nil {
				t.Fatal(err)
			}
			// A keyed request must not go out on a reservation written
			// into a file nobody will find again.
			if _, _, err := s.Reserve(ctx, newOp("after")); !errors.Is(err, idemstore.ErrJournalWrite) {
				t.Fatalf("Reserve after the journal was removed = %v, want ErrJournalWrite", err)
			}
			if err := s.Finish(ctx, "before", idemstore.Outcome{State: idemstore.StateSucceeded, Status: 200}); err != nil {
				t.Fatalf("Finish (queued): %v", err)
			}
			if err := s.Close(); !errors.Is(err, idemstore.ErrJournalWrite) {
				t.Fatalf("Close with a queued change it could not write = %v, want ErrJournalWrite", err)
			}
		})
	}
}

func TestBoltStoreFinishSurvivesFullDisk(t *testing.T) {
	// Finish marks ride the next commit. When that commit fails (the disk
	// is full), the marks are kept and written by a later commit: an
	// operation whose caller got its response never stays pending.
	dir := t.TempDir()
	mount(t, "tmpfs", dir, "tmpfs", 0, "size=2m")
	path := filepath.Join(dir, "journal.db")
	var mu sync.Mutex
	var reported []error
	// The marks are held for the reservation's commit: on their own (after
	// the 20 ms default delay, or with the scrub) they fit in the file's
	// free pages, commit, and the test proves nothing (it failed so when
	// it ran slow).
	s, err := boltjournal.OpenHoldingMarks(path, &boltjournal.Options{ScrubDelay: -1, OnWriteError: func(err error) {
		mu.Lock()
		reported = append(reported, err)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	var keys []string
	for i := range 20 {
		op := newOp(fmt.Sprintf("key-%02d", i))
		mustReserve(t, s, op)
		keys = append(keys, op.Key)
	}
	// Fill the file system.
	filler := filepath.Join(dir, "filler")
	ff, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64*1024)
	for {
		if _, err := ff.Write(chunk); err != nil {
			break
		}
	}
	ff.Close()
	for _, k := range keys {
		if err := s.Finish(ctx, k, idemstore.Outcome{State: idemstore.StateSucceeded, Status: 201, Sent: 1}); err != nil {
			t.Fatalf("Finish(%s): %v", k, err)
		}
	}
	// A reservation that needs new pages carries the marks into a commit
	// that fails.
	big := newOp("big")
	big.Body = bytes.Repeat([]byte("b"), 1<<20)
	if _, _, err := s.Reserve(ctx, big); !errors.Is(err, idemstore.ErrJournalWrite) {
		t.Fatalf("Reserve on a full disk = %v, want ErrJournalWrite", err)
	}
	// Space again: the kept marks are written.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s2 := openBolt(t, path)
	for _, k := range keys {
		op, err := s2.Get(ctx, k)
		if err != nil || op.State != idemstore.StateSucceeded {
			t.Errorf("%s after the disk was full: state %v, %v; want succeeded", k, op.State, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reported) == 0 || !errors.Is(reported[0], idemstore.ErrJournalWrite) {
		t.Fatalf("OnWriteError got %v, want the failed commit of the marks", reported)
	}
}
