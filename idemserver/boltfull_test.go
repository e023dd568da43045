//go:build linux

package idemserver

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/idemgo/idem"
)

// TestBoltIndexAfterFailedCommit fails Completes the way a full disk
// does (the file may not grow: RLIMIT_FSIZE, which the Go runtime turns
// into EFBIG rather than a signal): a new key, and a key whose expired
// record was not swept yet. The index must keep saying what the file
// holds: nothing new, the old record still there; the key stays its
// holder's, whose Complete succeeds once the file can grow.
func TestBoltIndexAfterFailedCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	s, err := OpenBoltStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	small := &Response{Status: 201, Header: map[string][]string{}, Body: []byte("small")}
	big := &Response{Status: 201, Header: map[string][]string{}, Body: bytes.Repeat([]byte("b"), 4<<20)}
	begin := func(id string, now time.Time) Claim {
		t.Helper()
		c, err := beginAt(s, id, now)
		if err != nil {
			t.Fatalf("Begin %s: %v", id, err)
		}
		return c
	}
	c := begin("old", t0)
	if err := s.Complete(ctx, Completion{ID: "old", Token: c.Token, Response: small, Now: t0, Until: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	oldExp, _ := s.flights.lookup("old")

	// Two keys claimed at t0+2h, "old"'s record expired and not swept.
	now := t0.Add(2 * time.Hour)
	cNew, cOld := begin("new", now), begin("old", now)
	if cNew.State != StateAcquired || cOld.State != StateAcquired {
		t.Fatalf("claims: %v %v, want acquired", cNew.State, cOld.State)
	}

	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Skip("no RLIMIT_FSIZE:", err)
	}
	full := lim
	full.Cur = uint64(fi.Size())
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &full); err != nil {
		t.Skip("cannot limit the file size:", err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer restore()
	for _, c := range []struct {
		id  string
		tok string
	}{{"new", cNew.Token}, {"old", cOld.Token}} {
		err := s.Complete(ctx, Completion{ID: c.id, Token: c.tok, Response: big, Now: now, Until: now.Add(time.Hour)})
		if !errors.Is(err, idem.ErrJournalWrite) {
			t.Fatalf("Complete %s on a full disk: %v, want ErrJournalWrite", c.id, err)
		}
	}
	restore()

	// Nothing changed: the index as the file says.
	s.flights.mu.Lock()
	_, hasNew := s.flights.lookup("new")
	gotOld, _ := s.flights.lookup("old")
	s.flights.mu.Unlock()
	if hasNew || gotOld != oldExp {
		t.Errorf("index after the failed commits: new %v, old at %d; want none, old at %d", hasNew, gotOld, oldExp)
	}
	if n := countRecords(t, s); n != 1 {
		t.Errorf("%d records in the file after the failed commits, want 1", n)
	}
	// The keys are still their holders'.
	if c := begin("new", now); c.State != StateInFlight {
		t.Errorf("new after its failed Complete: %v, want in flight", c.State)
	}
	// The old record is swept meanwhile; the holders complete.
	if n, err := s.Sweep(ctx, now); err != nil || n != 1 {
		t.Fatalf("Sweep: %d, %v; want 1", n, err)
	}
	for _, c := range []struct{ id, tok string }{{"new", cNew.Token}, {"old", cOld.Token}} {
		if err := s.Complete(ctx, Completion{ID: c.id, Token: c.tok, Response: big, Now: now, Until: now.Add(time.Hour)}); err != nil {
			t.Fatalf("Complete %s once the disk has room: %v", c.id, err)
		}
	}
	check := func(s *BoltStore) {
		t.Helper()
		if n := countRecords(t, s); n != 2 {
			t.Errorf("%d records in the file, want 2", n)
		}
		for _, id := range []string{"new", "old"} {
			c, err := beginAt(s, id, now.Add(time.Minute))
			if err != nil || c.State != StateDone || len(c.Response.Body) != len(big.Body) {
				t.Errorf("%s: %v %v, want done with the big body", id, c.State, err)
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
}

// countRecords returns how many records the file of s holds.
func countRecords(t *testing.T, s *BoltStore) int {
	t.Helper()
	n := 0
	if err := s.read(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketRecords).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}
