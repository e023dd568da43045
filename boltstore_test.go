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
