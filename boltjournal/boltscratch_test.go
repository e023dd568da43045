package boltjournal_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/boltjournal"
	"github.com/idemgo/idem/idemstore"
)

// TestBoltStoreReusedChangesKeepTheirOwn checks the reuse of the journal's
// changes (reservations, finish marks, the transaction's scratch): many
// callers at once reserve and finish records with a status and an error
// text of their own, in groups of every size, and each record ends with
// its own outcome and request, after a reopen too.
func TestBoltStoreReusedChangesKeepTheirOwn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	s := openBolt(t, path)
	ctx := context.Background()
	const callers, each = 16, 40
	now := time.Now()
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := range each {
				n := c*each + i
				op := idemstore.Operation{
					Key: fmt.Sprintf("k-%04d", n), Method: "POST", URL: fmt.Sprintf("http://h/%d", n),
					State: idemstore.StatePending, Created: now, Updated: now, Owner: "o", LeaseUntil: now.Add(time.Minute),
					Header: map[string][]string{"X-N": {fmt.Sprint(n)}}, Body: []byte(fmt.Sprintf(`{"n":%d}`, n)),
				}
				if _, created, err := s.Reserve(ctx, op); err != nil || !created {
					t.Errorf("reserve %d: %v, created %v", n, err, created)
					return
				}
				if i%2 == 1 { // every other one stays pending, with its request
					continue
				}
				if err := s.Finish(ctx, op.Key, idemstore.Outcome{State: idemstore.StateSucceeded, Status: 200 + n%100, Err: fmt.Sprint("e", n), URL: op.URL, At: now}); err != nil {
					t.Errorf("finish %d: %v", n, err)
				}
			}
		})
	}
	wg.Wait()
	check := func(s *boltjournal.Store) {
		for n := range callers * each {
			op, err := s.Get(ctx, fmt.Sprintf("k-%04d", n))
			if err != nil {
				t.Fatal(err)
			}
			if n%2 == 1 {
				if op.State != idemstore.StatePending || string(op.Body) != fmt.Sprintf(`{"n":%d}`, n) || op.Header.Get("X-N") != fmt.Sprint(n) {
					t.Fatalf("record %d: %v, body %q, header %v", n, op.State, op.Body, op.Header)
				}
				continue
			}
			if op.State != idemstore.StateSucceeded || op.LastStatus != 200+n%100 || op.LastError != fmt.Sprint("e", n) || op.URL != fmt.Sprintf("http://h/%d", n) || op.Body != nil {
				t.Fatalf("record %d: %v, status %d, error %q, URL %s, body %q", n, op.State, op.LastStatus, op.LastError, op.URL, op.Body)
			}
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	check(openBolt(t, path))
}
