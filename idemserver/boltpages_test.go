package idemserver

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestBoltGroupCommitPages commits the records of 32 new keys in one
// transaction, as a group commit of 32 completions does, into a store
// that holds 3000: their keys are hashes (random), yet the records are
// neighbours in the file, so the commit writes a few pages, not a leaf
// page or more per key.
func TestBoltGroupCommitPages(t *testing.T) {
	s, err := OpenBoltStore(filepath.Join(t.TempDir(), "keys.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	resp := &Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ord_1","status":"created"}`)}
	i := 0
	nextKey := func() (string, time.Time) {
		i++
		id := hexSum([]byte(strconv.Itoa(i)))
		return id, t0.Add(time.Duration(i) * time.Millisecond) // one request a millisecond
	}
	group := func(n int) error {
		return s.write(ctx, func(tx *bolt.Tx) error {
			for range n {
				id, now := nextKey()
				until := now.Add(24 * time.Hour)
				v := encode(&record{fingerprint: hexSum([]byte(id)), expires: until, resp: resp})
				if _, _, err := putRecord(tx, id, idHash(id), nil, recordKey(expiresAt(until), id), v); err != nil {
					return err
				}
			}
			return nil
		})
	}
	for range 100 {
		if err := group(30); err != nil {
			t.Fatal(err)
		}
	}
	before := boltTxStats(t, s)
	if err := group(32); err != nil {
		t.Fatal(err)
	}
	// The records (about 200 bytes each: 2 leaf pages), the branch above
	// them, the root page, the free list and the meta page.
	pages := boltTxStats(t, s).Write - before.Write
	t.Logf("%d pages", pages)
	if pages > 12 {
		t.Errorf("a commit of 32 new keys wrote %d pages, want at most 12", pages)
	}
}

// boltTxStats returns the file's transaction statistics so far.
func boltTxStats(tb testing.TB, s *BoltStore) (st bolt.TxStats) {
	tb.Helper()
	if err := s.f.View(func(tx *bolt.Tx) error { st = tx.DB().Stats().TxStats; return nil }); err != nil {
		tb.Fatal(err)
	}
	return st
}
