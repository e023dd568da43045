package idem_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/crashtest"
	bolt "go.etcd.io/bbolt"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func openBolt(t *testing.T, path string) *idem.BoltStore {
	t.Helper()
	s, err := idem.OpenBoltStore(path, &idem.BoltOptions{LockTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// checkFile runs bbolt's consistency check on a closed journal.
func checkFile(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatalf("bbolt consistency check: %v", err)
	}
}

func TestBoltStoreFileMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	openBolt(t, path)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("journal mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestBoltStoreSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	s, err := idem.OpenBoltStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	op := newOp("k1")
	op.Name = "n1"
	mustReserve(t, s, op)
	mustReserve(t, s, newOp("k2"))
	if err := s.Attempt(ctx, "k1", idem.Attempt{Sent: 1, Status: 503}); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, "k2", idem.Outcome{State: idem.StateSucceeded, Status: 200}); err != nil {
		t.Fatal(err)
	}
	// Close commits the queued Attempt and Finish.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openBolt(t, path)
	got, err := s.Named(ctx, "n1")
	if err != nil || got.Attempts != 1 || got.LastStatus != 503 || !bytes.Equal(got.Body, op.Body) {
		t.Fatalf("k1 after reopen: %+v, %v", got, err)
	}
	if got, err := s.Get(ctx, "k2"); err != nil || got.State != idem.StateSucceeded {
		t.Fatalf("k2 after reopen: %+v, %v", got, err)
	}
}

func TestBoltStoreLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	openBolt(t, path)
	// flock also excludes a second handle in the same process.
	s, err := idem.OpenBoltStore(path, &idem.BoltOptions{LockTimeout: 50 * time.Millisecond})
	if !errors.Is(err, idem.ErrJournalLocked) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("second open: got %v, want ErrJournalLocked", err)
	}
}

func TestBoltStoreCorrupt(t *testing.T) {
	// A journal with a few records, to damage.
	valid := func(t *testing.T) []byte {
		path := filepath.Join(t.TempDir(), "valid.db")
		s, err := idem.OpenBoltStore(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 50 {
			op := newOp(fmt.Sprint("key-", i))
			op.Body = bytes.Repeat([]byte("x"), 2000)
			mustReserve(t, s, op)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	foreign := func(t *testing.T) []byte {
		path := filepath.Join(t.TempDir(), "foreign.db")
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("users")); return err }); err != nil {
			t.Fatal(err)
		}
		db.Close()
		b, _ := os.ReadFile(path)
		return b
	}
	garbage := make([]byte, 64*1024)
	rand.Read(garbage)

	tests := []struct {
		name string
		file func(t *testing.T) []byte
	}{
		{"garbage", func(*testing.T) []byte { return garbage }},
		{"text", func(*testing.T) []byte { return []byte(strings.Repeat("not a journal\n", 1000)) }},
		{"truncated to 100 bytes", func(t *testing.T) []byte { return valid(t)[:100] }},
		{"truncated to one page", func(t *testing.T) []byte { return valid(t)[:4096] }},
		{"truncated to half", func(t *testing.T) []byte { b := valid(t); return b[:len(b)/2] }},
		{"meta pages zeroed", func(t *testing.T) []byte { b := valid(t); clear(b[:8192]); return b }},
		{"foreign bbolt file", foreign},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.db")
			if err := os.WriteFile(path, tc.file(t), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := idem.OpenBoltStore(path, nil)
			if err == nil {
				s.Close()
				t.Fatal("opened a damaged journal without error")
			}
			if !errors.Is(err, idem.ErrJournalCorrupt) {
				t.Fatalf("got %v, want ErrJournalCorrupt", err)
			}
		})
	}
}

func TestBoltStoreDamagedPages(t *testing.T) {
	// Pages damaged after the meta pages: opening may succeed, but reading
	// them must give ErrJournalCorrupt (or succeed), never panic or hang.
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.db")
			s, err := idem.OpenBoltStore(path, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 40 {
				op := newOp(fmt.Sprint("key-", i))
				op.Name = fmt.Sprint("name-", i)
				op.Body = bytes.Repeat([]byte("y"), 1500)
				mustReserve(t, s, op)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			r := mathrand.New(mathrand.NewPCG(seed, 1))
			for range 4 {
				page := 2 + r.IntN(len(b)/4096-2)
				for j := range 4096 {
					b[page*4096+j] = byte(r.Uint32())
				}
			}
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err = idem.OpenBoltStore(path, nil)
			if err != nil {
				if !errors.Is(err, idem.ErrJournalCorrupt) {
					t.Fatalf("open: got %v, want ErrJournalCorrupt", err)
				}
				return
			}
			defer s.Close()
			ctx := t.Context()
			okErr := func(what string, err error) {
				if err != nil && !errors.Is(err, idem.ErrJournalCorrupt) && !errors.Is(err, idem.ErrNotFound) {
					t.Errorf("%s: got %v, want nil, ErrJournalCorrupt or ErrNotFound", what, err)
				}
			}
			for i := range 40 {
				_, err := s.Get(ctx, fmt.Sprint("key-", i))
				okErr("Get", err)
				_, err = s.Named(ctx, fmt.Sprint("name-", i))
				okErr("Named", err)
			}
			_, err = s.Pending(ctx, "", 0)
			okErr("Pending", err)
			_, _, err = s.Reserve(ctx, newOp("new"))
			okErr("Reserve", err)
		})
	}
}

func TestBoltStoreNewerRecordVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	s, err := idem.OpenBoltStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "future", "c"} {
		mustReserve(t, s, newOp(k))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A newer idem rewrote one record in a format this one cannot read.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(idem.BucketOps).Put([]byte("future"), []byte{0xfe, 1, 2, 3})
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	s = openBolt(t, path)
	ctx := t.Context()
	if _, err := s.Get(ctx, "future"); !errors.Is(err, idem.ErrRecordVersion) {
		t.Errorf("Get: got %v, want ErrRecordVersion", err)
	}
	if _, _, err := s.Reserve(ctx, newOp("future")); !errors.Is(err, idem.ErrRecordVersion) {
		t.Errorf("Reserve: got %v, want ErrRecordVersion", err)
	}
	if err := s.Finish(ctx, "future", idem.Outcome{State: idem.StateSucceeded}); !errors.Is(err, idem.ErrRecordVersion) {
		t.Errorf("Finish: got %v, want ErrRecordVersion", err)
	}
	if _, err := s.Acquire(ctx, "future", idem.Lease{Owner: "me"}, nil, nil); !errors.Is(err, idem.ErrRecordVersion) {
		t.Errorf("Acquire: got %v, want ErrRecordVersion", err)
	}
	pend, err := s.Pending(ctx, "", 0)
	if !errors.Is(err, idem.ErrRecordVersion) || fmt.Sprint(keys(pend)) != "[a c future]" || pend[2].State != 0 {
		t.Errorf("Pending = %v, %v; want [a c future], the unreadable one reported with ErrRecordVersion", keys(pend), err)
	}
	for _, k := range []string{"a", "c"} {
		if _, err := s.Get(ctx, k); err != nil {
			t.Errorf("Get(%s): %v", k, err)
		}
	}
}

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
	path := filepath.Join(dir, "journal.db")
	s, err := idem.OpenBoltStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, newOp("k1"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	mount(t, dir, ro, "", syscall.MS_BIND, "")
	mount(t, "", ro, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY, "")

	for _, name := range []string{"journal.db", "new.db"} {
		s, err := idem.OpenBoltStore(filepath.Join(ro, name), nil)
		if err == nil {
			s.Close()
			t.Fatalf("%s: opened a journal on a read-only file system", name)
		}
		if !errors.Is(err, idem.ErrJournalWrite) {
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
	s, err := idem.OpenBoltStore(path, nil)
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
	if !errors.Is(full, idem.ErrJournalWrite) {
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
	if err := s.Close(); err != nil && !errors.Is(err, idem.ErrJournalWrite) {
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

func init() { crashChildren["reserve"] = childReserve }

// childReserve is the child of TestCrashReserve: it reserves keys in a loop
// from several goroutines and emits each key after Reserve returned, until
// it is killed.
func childReserve() int {
	ctx := context.Background()
	s, err := idem.OpenBoltStore(os.Getenv("IDEM_JOURNAL"), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	prefix := os.Getenv("IDEM_ROUND")
	done := make(chan struct{})
	var once sync.Once
	for g := range 4 {
		go func() {
			for i := 0; ; i++ {
				key := fmt.Sprintf("%s-%d-%d", prefix, g, i)
				op := newOp(key)
				op.Name = "name-" + key
				if _, _, err := s.Reserve(ctx, op); err != nil {
					crashtest.Emit("error", err.Error())
					once.Do(func() { close(done) })
					return
				}
				crashtest.Emit("reserved", key)
				if i%3 == 0 {
					_ = s.Finish(ctx, key, idem.Outcome{State: idem.StateSucceeded, Status: 200})
				}
			}
		}()
	}
	<-done // only on error; normally the parent kills us first
	return 1
}

func TestCrashReserve(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	for round := range 4 {
		prefix := fmt.Sprint("r", round)
		child := crashtest.Start(t, "reserve", "IDEM_JOURNAL="+path, "IDEM_ROUND="+prefix)
		lines := child.KillAfter(1 + mathrand.IntN(300))
		var reserved []string
		for _, l := range lines {
			kind, arg, _ := strings.Cut(l, " ")
			if kind != "reserved" {
				t.Fatalf("child: %s", l)
			}
			reserved = append(reserved, arg)
		}
		if len(reserved) == 0 {
			t.Fatal("child reserved nothing before it was killed")
		}
		checkFile(t, path)
		s, err := idem.OpenBoltStore(path, nil)
		if err != nil {
			t.Fatalf("round %d: reopen after SIGKILL: %v", round, err)
		}
		for _, k := range reserved {
			op, err := s.Get(t.Context(), k)
			if err != nil {
				t.Errorf("round %d: key %s was reserved before the crash: %v", round, k, err)
				continue
			}
			if named, err := s.Named(t.Context(), "name-"+k); err != nil || named.Key != k {
				t.Errorf("round %d: name of %s: %v", round, k, err)
			}
			if op.State == idem.StatePending && !bytes.Equal(op.Body, newOp(k).Body) {
				t.Errorf("round %d: pending %s lost its body", round, k)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %d keys reserved before SIGKILL, all present", round, len(reserved))
	}
}

func TestBoltStoreOpenErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.db")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path string
		want       error
	}{
		// Only a missing file creates a journal: an existing empty one
		// lost its contents, and its pending operations with them.
		{"empty file", empty, idem.ErrJournalCorrupt},
		// These say nothing about a journal's contents: it cannot be
		// created or opened.
		{"empty path", "", idem.ErrJournalWrite},
		{"missing parent directory", filepath.Join(dir, "nope", "journal.db"), idem.ErrJournalWrite},
		{"path is a directory", dir, idem.ErrJournalWrite},
		{"parent is a file", filepath.Join(notDir, "journal.db"), idem.ErrJournalWrite},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := idem.OpenBoltStore(tc.path, nil)
			if err == nil {
				s.Close()
				t.Fatal("opened without error")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			for _, other := range []error{idem.ErrJournalCorrupt, idem.ErrJournalWrite} {
				if other != tc.want && errors.Is(err, other) {
					t.Fatalf("got %v, which also matches %v", err, other)
				}
			}
		})
	}
	if fi, err := os.Stat(empty); err != nil || fi.Size() != 0 {
		t.Fatalf("the empty journal was changed: %v, %v", fi, err)
	}
}

// forgeFormat rewrites the format marker of the closed journal at path.
func forgeFormat(t *testing.T, path, format string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(idem.BucketMeta).Put(idem.MetaFormatKey, []byte(format))
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestBoltStoreFormatVersions(t *testing.T) {
	for _, tc := range []struct {
		format  string
		want    error
		message string
	}{
		{"idem-journal/1", idem.ErrRecordVersion, "earlier"},
		{"idem-journal/3", idem.ErrRecordVersion, "newer"},
		{"idem-journal/10", idem.ErrRecordVersion, "newer"},
		{"something else", idem.ErrJournalCorrupt, "marker"},
	} {
		t.Run(tc.format, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.db")
			s, err := idem.OpenBoltStore(path, nil)
			if err != nil {
				t.Fatal(err)
			}
			mustReserve(t, s, newOp("k1"))
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			forgeFormat(t, path, tc.format)
			s, err = idem.OpenBoltStore(path, nil)
			if err == nil {
				s.Close()
				t.Fatal("opened without error")
			}
			if !errors.Is(err, tc.want) || (tc.want == idem.ErrRecordVersion && errors.Is(err, idem.ErrJournalCorrupt)) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("message %q does not say %q", err, tc.message)
			}
		})
	}
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
			if _, _, err := s.Reserve(ctx, newOp("after")); !errors.Is(err, idem.ErrJournalWrite) {
				t.Fatalf("Reserve after the journal was removed = %v, want ErrJournalWrite", err)
			}
			if err := s.Finish(ctx, "before", idem.Outcome{State: idem.StateSucceeded, Status: 200}); err != nil {
				t.Fatalf("Finish (queued): %v", err)
			}
			if err := s.Close(); !errors.Is(err, idem.ErrJournalWrite) {
				t.Fatalf("Close with a queued change it could not write = %v, want ErrJournalWrite", err)
			}
		})
	}
}

func TestBoltStoreDamagedPageDuringWrite(t *testing.T) {
	// A page damaged under a running store: the write that reads it fails
	// with ErrJournalCorrupt, not an untyped panic message.
	path := filepath.Join(t.TempDir(), "journal.db")
	s, err := idem.OpenBoltStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 200 {
		op := newOp(fmt.Sprintf("key-%03d", i))
		op.Body = bytes.Repeat([]byte("z"), 300)
		mustReserve(t, s, op)
	}
	// Overwrite every page but the meta pages in place, behind bbolt's
	// back, with bytes that are no page type bbolt knows.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	junk := bytes.Repeat([]byte{0xA5}, int(fi.Size())-8192)
	if _, err := f.WriteAt(junk, 8192); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, _, err = s.Reserve(t.Context(), newOp("key-100x"))
	if !errors.Is(err, idem.ErrJournalCorrupt) {
		t.Fatalf("Reserve over damaged pages = %v, want ErrJournalCorrupt", err)
	}
	if err := s.Attempt(t.Context(), "key-050", idem.Attempt{Sent: 1}); err != nil && !errors.Is(err, idem.ErrJournalCorrupt) {
		t.Fatalf("Attempt = %v, want nil (queued) or ErrJournalCorrupt", err)
	}
	if _, err := s.Get(t.Context(), "key-050"); !errors.Is(err, idem.ErrJournalCorrupt) {
		t.Fatalf("Get = %v, want ErrJournalCorrupt", err)
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
	s, err := idem.OpenBoltStore(path, &idem.BoltOptions{OnWriteError: func(err error) {
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
		if err := s.Finish(ctx, k, idem.Outcome{State: idem.StateSucceeded, Status: 201, Sent: 1}); err != nil {
			t.Fatalf("Finish(%s): %v", k, err)
		}
	}
	// A reservation that needs new pages carries the marks into a commit
	// that fails.
	big := newOp("big")
	big.Body = bytes.Repeat([]byte("b"), 1<<20)
	if _, _, err := s.Reserve(ctx, big); !errors.Is(err, idem.ErrJournalWrite) {
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
		if err != nil || op.State != idem.StateSucceeded {
			t.Errorf("%s after the disk was full: state %v, %v; want succeeded", k, op.State, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reported) == 0 || !errors.Is(reported[0], idem.ErrJournalWrite) {
		t.Fatalf("OnWriteError got %v, want the failed commit of the marks", reported)
	}
}

func TestBoltStoreScrubsFinishedRequests(t *testing.T) {
	const card = "4242424242424242"
	for _, tc := range []struct {
		name  string
		delay time.Duration
	}{
		{"while open", 10 * time.Millisecond},
		{"at Close", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.db")
			s, err := idem.OpenBoltStore(path, &idem.BoltOptions{ScrubDelay: tc.delay})
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			for i := range 30 {
				op := newOp(fmt.Sprintf("key-%02d", i))
				op.Body = []byte(fmt.Sprintf(`{"card":"%s","n":%d,"pad":"%s"}`, card, i, strings.Repeat("p", 40*i)))
				mustReserve(t, s, op)
				if err := s.Attempt(ctx, op.Key, idem.Attempt{Sent: 1, Status: 503}); err != nil {
					t.Fatal(err)
				}
			}
			pending := newOp("still-pending")
			pending.Body = []byte(`{"card":"5555444433331111"}`)
			mustReserve(t, s, pending)
			has := func(s string) bool {
				b, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				return bytes.Contains(b, []byte(s))
			}
			if !has(card) {
				t.Fatal("the card number is not in the journal at all: the test proves nothing")
			}
			for i := range 30 {
				if err := s.Finish(ctx, fmt.Sprintf("key-%02d", i), idem.Outcome{State: idem.StateSucceeded, Status: 201}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Get(ctx, "key-00"); err != nil { // the marks are committed
				t.Fatal(err)
			}
			if tc.delay > 0 {
				// Bounded: the scrub follows the finish commit by about
				// ScrubDelay; allow a loaded machine plenty more.
				deadline := time.Now().Add(10 * time.Second)
				for has(card) && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if has(card) {
					t.Fatal("the card number of finished operations is still in the journal file 10s after they finished")
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if has(card) {
				t.Fatal("the card number of finished operations is still in the journal file after Close")
			}
			if !has("5555444433331111") {
				t.Fatal("the pending operation's body is gone from the file")
			}
			checkFile(t, path)
			s2 := openBolt(t, path)
			if op, err := s2.Get(ctx, "still-pending"); err != nil || !bytes.Equal(op.Body, pending.Body) {
				t.Fatalf("pending operation after scrubbing: %+v, %v", op, err)
			}
		})
	}
}

func TestBoltStorePendingNeverSkipsInSilence(t *testing.T) {
	// One page at a time damaged: every pending operation is returned
	// intact, or reported (its key with an error), or the journal as a
	// whole is reported corrupt. None goes missing without an error, and
	// none comes back with a damaged request.
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "journal.db")
	s, err := idem.OpenBoltStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{}
	for i := range 120 {
		op := newOp(fmt.Sprintf("key-%03d", i))
		op.Body = bytes.Repeat([]byte{byte('a' + i%26)}, 100+37*i)
		mustReserve(t, s, op)
		if i%3 == 0 {
			if err := s.Finish(ctx, op.Key, idem.Outcome{State: idem.StateSucceeded, Status: 200}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want[op.Key] = op.Body
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pages := len(orig) / 4096
	r := mathrand.New(mathrand.NewPCG(7, 7))
	for page := 2; page < pages; page++ {
		for _, kind := range []string{"random", "one byte"} {
			b := bytes.Clone(orig)
			if kind == "random" {
				for j := range 4096 {
					b[page*4096+j] = byte(r.Uint32())
				}
			} else {
				b[page*4096+16+r.IntN(4096-16)] ^= byte(1 + r.IntN(255))
			}
			p := filepath.Join(t.TempDir(), "journal.db")
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			func() {
				s, err := idem.OpenBoltStore(p, nil)
				if err != nil {
					if !errors.Is(err, idem.ErrJournalCorrupt) {
						t.Fatalf("page %d (%s): open = %v, want ErrJournalCorrupt", page, kind, err)
					}
					return
				}
				defer s.Close()
				ops, err := s.Pending(ctx, "", 0)
				if err != nil && !errors.Is(err, idem.ErrJournalCorrupt) && !errors.Is(err, idem.ErrRecordVersion) {
					t.Fatalf("page %d (%s): Pending error %v is not typed", page, kind, err)
				}
				got := map[string]bool{}
				for _, op := range ops {
					got[op.Key] = true
					if op.State == 0 {
						if err == nil {
							t.Fatalf("page %d (%s): %s reported unreadable without an error", page, kind, op.Key)
						}
						continue
					}
					if body, ok := want[op.Key]; ok && !bytes.Equal(op.Body, body) {
						t.Fatalf("page %d (%s): %s returned with a damaged body", page, kind, op.Key)
					}
				}
				for k := range want {
					if !got[k] && err == nil {
						t.Fatalf("page %d (%s): pending %s is missing and Pending reported no error", page, kind, k)
					}
				}
			}()
		}
	}
}

func TestBoltStoreCompactsMostlyFreeJournalAtOpen(t *testing.T) {
	// A burst of large requests, all finished: the file keeps their pages
	// (free now) until Open finds it mostly free and compacts it.
	path := filepath.Join(t.TempDir(), "journal.db")
	s, err := idem.OpenBoltStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 25 {
				op := newOp(fmt.Sprintf("big-%d-%02d", g, i))
				op.Body = bytes.Repeat([]byte{'x'}, 100<<10)
				if _, _, err := s.Reserve(ctx, op); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for g := range 8 {
		for i := range 25 {
			if err := s.Finish(ctx, fmt.Sprintf("big-%d-%02d", g, i), idem.Outcome{State: idem.StateSucceeded, Status: 201}); err != nil {
				t.Fatal(err)
			}
		}
	}
	keep := newOp("pending")
	keep.Name = "pay:pending"
	mustReserve(t, s, keep)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if before.Size() < 16<<20 {
		t.Fatalf("the burst left a %d-byte file: too small to test compaction", before.Size())
	}
	s = openBolt(t, path)
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if after.Size() > before.Size()/4 {
		t.Fatalf("journal of %d bytes, mostly free, is %d bytes after Open; want it compacted", before.Size(), after.Size())
	}
	t.Logf("compacted at Open: %d -> %d bytes", before.Size(), after.Size())
	if got, err := s.Named(ctx, "pay:pending"); err != nil || !bytes.Equal(got.Body, keep.Body) {
		t.Fatalf("pending operation after compaction: %+v, %v", got, err)
	}
	if got, err := s.Get(ctx, "big-3-07"); err != nil || got.State != idem.StateSucceeded {
		t.Fatalf("finished operation after compaction: %+v, %v", got, err)
	}
	mustReserve(t, s, newOp("after-compaction"))
	if _, err := os.Stat(path + ".compact"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("compaction left its temporary file: %v", err)
	}
}

func TestBoltStoreLargeBodies(t *testing.T) {
	// Bodies from 32 KiB on are stored apart from their record; every
	// path that returns or drops a request must see them.
	path := filepath.Join(t.TempDir(), "journal.db")
	s, err := idem.OpenBoltStore(path, &idem.BoltOptions{ScrubDelay: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	body := func(tag string, n int) []byte {
		return append([]byte(`{"card":"`+tag+`","pad":"`), append(bytes.Repeat([]byte{'p'}, n), `"}`...)...)
	}
	big, small := newOp("a-big"), newOp("b-small")
	big.Name = "pay:big"
	big.Body, small.Body = body("4000000000000002", 200<<10), body("4000000000000010", 100)
	mustReserve(t, s, big)
	mustReserve(t, s, small)
	if got, err := s.Get(ctx, "a-big"); err != nil || !bytes.Equal(got.Body, big.Body) {
		t.Fatalf("Get: body of %d bytes, %v; want %d", len(got.Body), err, len(big.Body))
	}
	if got, created, err := s.Reserve(ctx, big); err != nil || created || !bytes.Equal(got.Body, big.Body) {
		t.Fatalf("Reserve of the existing record: created %v, body of %d bytes, %v", created, len(got.Body), err)
	}
	ops, err := s.Pending(ctx, "", 0)
	if err != nil || len(ops) != 2 || !bytes.Equal(ops[0].Body, big.Body) || !bytes.Equal(ops[1].Body, small.Body) {
		t.Fatalf("Pending = %v, %v; want both with their bodies", keys(ops), err)
	}
	l := idem.Lease{Owner: "resumer", At: time.Now(), Until: time.Now().Add(time.Minute)}
	ops, err = s.Claim(ctx, l, "", 0)
	if err != nil || len(ops) != 2 || !bytes.Equal(ops[0].Body, big.Body) {
		t.Fatalf("Claim = %v, %v; want both, the big one with its body", keys(ops), err)
	}
	if got, err := s.Get(ctx, "a-big"); err != nil || got.Owner != "resumer" || !bytes.Equal(got.Body, big.Body) {
		t.Fatalf("after Claim: owner %q body of %d bytes, %v", got.Owner, len(got.Body), err)
	}
	if err := s.Finish(ctx, "a-big", idem.Outcome{State: idem.StateSucceeded, Status: 201, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "a-big"); err != nil || got.Body != nil || got.State != idem.StateSucceeded {
		t.Fatalf("after Finish: state %v body of %d bytes, %v", got.State, len(got.Body), err)
	}
	if n, err := s.Sweep(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("Sweep = %d, %v", n, err)
	}
	// Acquire makes it pending again with a new large body.
	again := body("4000000000000028", 64<<10)
	if _, err := s.Acquire(ctx, "a-big", l, nil, again); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Named(ctx, "pay:big"); err != nil || !bytes.Equal(got.Body, again) {
		t.Fatalf("after Acquire: body of %d bytes, %v", len(got.Body), err)
	}
	if err := s.Finish(ctx, "a-big", idem.Outcome{State: idem.StateFailed, Status: 400}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, card := range []string{"4000000000000002", "4000000000000028"} {
		if bytes.Contains(b, []byte(card)) {
			t.Errorf("the body with %s is still in the file after its operation finished", card)
		}
	}
	if !bytes.Contains(b, []byte("4000000000000010")) {
		t.Error("the pending operation's body is gone from the file")
	}
	checkFile(t, path)
	s = openBolt(t, path)
	if n, err := s.Sweep(ctx, time.Now().Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("Sweep after reopening = %d, %v; want the one finished record", n, err)
	}
	if ops, err := s.Pending(ctx, "", 0); err != nil || len(ops) != 1 || !bytes.Equal(ops[0].Body, small.Body) {
		t.Fatalf("Pending after the sweep = %v, %v", keys(ops), err)
	}
}

func TestBoltStoreOnCommitAndLastChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	var (
		mu      sync.Mutex
		commits int
		changes int
	)
	s, err := idem.OpenBoltStore(path, &idem.BoltOptions{OnCommit: func(n int, d time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err == nil && d >= 0 {
			commits++
			changes += n
		}
	}})
	require.NoError(t, err)
	last, err := s.LastChange(t.Context())
	require.NoError(t, err)
	assert.True(t, last.IsZero(), "a new journal has no last change")
	for _, k := range []string{"a", "b", "c"} {
		mustReserve(t, s, newOp(k))
	}
	mu.Lock()
	assert.Positive(t, commits)
	assert.GreaterOrEqual(t, changes, 3, "every reservation rode a commit the hook heard of")
	mu.Unlock()
	require.NoError(t, s.Close())

	when := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	require.NoError(t, os.Chtimes(path, when, when))
	s, err = idem.OpenBoltStore(path, nil)
	require.NoError(t, err)
	defer s.Close()
	last, err = s.LastChange(t.Context())
	require.NoError(t, err)
	assert.True(t, last.Equal(when), "LastChange = %v, want the file's time %v", last, when)
}
