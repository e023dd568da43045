package idemserver_test

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/idemgo/idem/idemserver"
)

// TestBoltStoreNewKeyAllocations counts the allocations of a new key's
// Begin and Complete on a BoltStore, its commit included (one caller, so
// one commit each): 106 before the records were kept in expiry order with
// an index in memory (no read transaction for a new key, no record to
// delete, fewer pages) and counter tokens, 66 after; 94 once each commit
// also wrote the key's entry in the index bucket (a second bucket's leaf
// and root in bbolt's commit, and a lookup of the entry's count), which
// keeps Open from reading the answers. Most of it is bbolt's commit, which
// a group of concurrent completions shares.
func TestBoltStoreNewKeyAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	s, err := idemserver.OpenBoltStore(filepath.Join(t.TempDir(), "keys.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	resp := &idemserver.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ord_1"}`)}
	ids := make([]string, 400)
	for i := range ids {
		ids[i] = "0000000000000000000000000000000000000000000000000000000000" + strconv.Itoa(100000+i)
	}
	i := 0
	allocs := testing.AllocsPerRun(200, func() {
		id := ids[i]
		i++
		now := t0.Add(time.Duration(i) * time.Millisecond)
		c, err := s.Begin(ctx, idemserver.Begin{ID: id, Fingerprint: "fp", Now: now, LeaseUntil: now.Add(time.Minute)})
		if err == nil {
			err = s.Complete(ctx, idemserver.Completion{ID: id, Token: c.Token, Response: resp, Now: now, Until: now.Add(time.Hour)})
		}
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.1f allocations per new key", allocs)
	if allocs > 96 {
		t.Errorf("%.1f allocations per new key, want at most 96", allocs)
	}
}
