package idemserver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/idemgo/idem"
)

// TestBoltBeginFailsClosedAfterMissingRecord: once a commit found the
// path naming another file, a Begin must not claim a key even when the
// index named a live record that the read then did not find (a sweep by
// a later clock took it): its answer could not be stored.
func TestBoltBeginFailsClosedAfterMissingRecord(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.db")
	s, err := OpenBoltStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	resp := &Response{Status: 201, Header: map[string][]string{}, Body: []byte("ok")}
	if err := completeAt(s, "k", t0, resp, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := beginAt(s, "other", t0); err != nil {
		t.Fatal(err)
	}
	// k's record leaves the file, its entry stays in the index.
	if err := s.write(ctx, func(tx *bolt.Tx) error {
		exp, _ := s.flights.lookup("k")
		return tx.Bucket(bucketRecords).Delete(recordKey(exp, "k"))
	}); err != nil {
		t.Fatal(err)
	}
	o, err := OpenBoltStore(filepath.Join(dir, "o.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "o.db"), path); err != nil {
		t.Fatal(err)
	}
	// A sweep's commit finds the file replaced.
	if _, err := s.Sweep(ctx, t0); !errors.Is(err, idem.ErrJournalWrite) {
		t.Fatalf("Sweep: %v, want ErrJournalWrite", err)
	}
	c, err := beginAt(s, "k", t0)
	if err == nil {
		t.Fatalf("Begin of k: %v, want an error (the file was replaced)", c.State)
	}
}
