package idemserver

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestBoltSweepRacesComplete runs a sweep beside the Complete of a key
// whose record is kept for less than the sweep's clock is ahead (the
// sweep may take it at once), in a bounded loop: after both, the index
// must hold the key exactly when the file holds its record. An entry
// whose record a sweep took, left behind, is never forgotten.
func TestBoltSweepRacesComplete(t *testing.T) {
	s, err := OpenBoltStore(filepath.Join(t.TempDir(), "keys.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	resp := &Response{Status: 201, Header: map[string][]string{}, Body: []byte("ok")}
	stale := 0
	for i := range 200 {
		id := fmt.Sprintf("k%03d", i)
		c, err := beginAt(s, id, t0)
		if err != nil || c.State != StateAcquired {
			t.Fatalf("Begin %s: %v %v", id, c.State, err)
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := s.Complete(ctx, Completion{ID: id, Token: c.Token, Response: resp, Now: t0, Until: t0.Add(time.Millisecond)}); err != nil {
				t.Error(err)
			}
		}()
		go func() {
			defer wg.Done()
			if _, err := s.Sweep(ctx, t0.Add(time.Second)); err != nil {
				t.Error(err)
			}
		}()
		wg.Wait()
		var inFile bool
		if err := s.read(func(tx *bolt.Tx) error {
			inFile = tx.Bucket(bucketRecords).Get(recordKey(expiresAt(t0.Add(time.Millisecond)), id)) != nil
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if inIndex := indexHas(s, id); inIndex != inFile {
			if !inIndex {
				t.Fatalf("%s: the file holds its record, the index does not", id)
			}
			stale++
		}
		if _, err := s.Sweep(ctx, t0.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if left := indexLen(s); stale > 0 || left > 0 {
		t.Errorf("%d of 200 keys left in the index after their records were swept (%d left at the end)", stale, left)
	}
}
