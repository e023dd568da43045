package idemserver

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/groupcommit"
)

// TestBoltCommitFailedAfterWrite: a bbolt commit whose meta page was
// written but whose fdatasync failed returns an error, yet the file, as
// this process reads it, holds the transaction, which may or may not be
// durable. Complete reports the failure (the answer is withheld). A retry
// must neither run the handler again (the first run's record may exist)
// nor get a replay of a record that may not be durable: it is told the
// key is in flight; and a new key is refused until the store is reopened.
// The reopened store answers from what the file holds.
func TestBoltCommitFailedAfterWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	s, err := OpenBoltStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The writer commits, then reports a failed sync when told to.
	var failSync atomic.Bool
	errSync := errors.New("fdatasync: input/output error")
	_ = s.w.Close()
	s.w = groupcommit.New(func(fn func(*bolt.Tx) error) error {
		err := s.f.Update(fn)
		if err == nil && failSync.Load() {
			return errSync
		}
		return err
	}, groupcommit.Options{Recover: s.f.Corrupt})

	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	c, err := beginAt(s, "k", t0)
	if err != nil || c.State != StateAcquired {
		t.Fatalf("Begin: %v %v", c.State, err)
	}
	failSync.Store(true)
	err = s.Complete(ctx, Completion{ID: "k", Token: c.Token, Response: &Response{Status: 201, Body: []byte("first")}, Now: t0, Until: t0.Add(time.Hour)})
	if !errors.Is(err, idem.ErrJournalWrite) {
		t.Fatalf("Complete: %v, want ErrJournalWrite", err)
	}
	failSync.Store(false)

	// The lease lapsed; the client retries.
	c, err = beginAt(s, "k", t0.Add(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if c.State != StateInFlight {
		t.Fatalf("retry after the lease: %v, want in flight: neither a second run nor a replay of an answer that may not be durable", c.State)
	}
	if c, err := beginAt(s, "other", t0.Add(2*time.Minute)); !errors.Is(err, idem.ErrJournalWrite) {
		t.Fatalf("a new key after the uncertain commit: %v %v, want ErrJournalWrite (the store refuses new keys until reopened)", c.State, err)
	}
	_ = s.w.Close()
	s.w = groupcommit.New(s.f.Update, groupcommit.Options{Recover: s.f.Corrupt})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = OpenBoltStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err = beginAt(s, "k", t0.Add(3*time.Minute))
	if err != nil || c.State != StateDone || string(c.Response.Body) != "first" {
		t.Fatalf("after reopening: %v %v, want done with the answer the file holds", c.State, err)
	}
}
