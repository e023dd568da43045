package idemserver

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestBoltExpiryOrderEdges: records whose expiries collide, go back (a
// clock stepped back between a key's Begin and its Complete, or a
// shorter retention), and a file with two records of one id (only damage
// or an earlier bug makes one): the index must name the record Begin
// replays, a sweep must not take a live record's entry out of the index,
// and a reopen must agree.
func TestBoltExpiryOrderEdges(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	path := filepath.Join(t.TempDir(), "keys.db")
	s, err := OpenBoltStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	resp := func(body string) *Response {
		return &Response{Status: 201, Header: map[string][]string{}, Body: []byte(body)}
	}
	complete := func(id string, begin, now, until time.Time, body string) {
		t.Helper()
		c, err := beginAt(s, id, begin)
		if err != nil || c.State != StateAcquired {
			t.Fatalf("Begin %s: %v %v, want acquired", id, c.State, err)
		}
		if err := s.Complete(ctx, Completion{ID: id, Token: c.Token, Response: resp(body), Now: now, Until: until}); err != nil {
			t.Fatalf("Complete %s: %v", id, err)
		}
	}
	replays := func(id string, now time.Time, body string) {
		t.Helper()
		c, err := beginAt(s, id, now)
		switch {
		case err != nil:
			t.Fatalf("Begin %s at %v: %v", id, now.Sub(t0), err)
		case body == "" && c.State != StateAcquired:
			t.Fatalf("Begin %s at %v: %v, want acquired", id, now.Sub(t0), c.State)
		case body == "":
			if err := s.Release(ctx, id, c.Token); err != nil {
				t.Fatal(err)
			}
		case c.State != StateDone || string(c.Response.Body) != body:
			t.Fatalf("Begin %s at %v: %v, want done with %q", id, now.Sub(t0), c.State, body)
		}
	}

	// Two keys that expire at the same nanosecond.
	complete("x", t0, t0, t0.Add(time.Hour), "x1")
	complete("y", t0, t0, t0.Add(time.Hour), "y1")
	// k is kept an hour, claimed again once expired, and completed by a
	// clock stepped back by three hours: its new record expires before
	// the old one would have, and before y's.
	complete("k", t0, t0, t0.Add(time.Hour), "k1")
	complete("k", t0.Add(2*time.Hour), t0.Add(-time.Hour), t0.Add(-time.Hour+30*time.Minute), "k2")
	replays("k", t0.Add(-time.Hour), "k2")

	// A record of d, damaged into two: an older one expiring later than
	// the one the index names would be the wrong answer.
	if err := s.write(ctx, func(tx *bolt.Tx) error {
		for _, r := range []struct {
			until time.Time
			body  string
		}{{t0.Add(10 * time.Minute), "d-early"}, {t0.Add(3 * time.Hour), "d-late"}} {
			v := encode(&record{fingerprint: "fp", expires: r.until, resp: resp(r.body)})
			if _, _, err := putRecord(tx, "d", idHash("d"), nil, recordKey(expiresAt(r.until), "d"), v); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check := func() {
		t.Helper()
		replays("x", t0.Add(time.Minute), "x1")
		replays("y", t0.Add(time.Minute), "y1")
		replays("k", t0.Add(-time.Hour), "k2")
	}
	check()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = OpenBoltStore(path, nil); err != nil {
		t.Fatal(err)
	}
	check()
	// Of d's two records, the later is replayed.
	replays("d", t0.Add(time.Minute), "d-late")

	// A sweep at t0+20m takes d's early record and k's: d's entry stays.
	if n, err := s.Sweep(ctx, t0.Add(20*time.Minute)); err != nil || n != 2 {
		t.Fatalf("Sweep at +20m: %d, %v; want 2", n, err)
	}
	replays("d", t0.Add(30*time.Minute), "d-late")
	replays("x", t0.Add(30*time.Minute), "x1")
	replays("k", t0.Add(30*time.Minute), "")
	// Both colliding keys go at their shared expiry, d at its own.
	if n, err := s.Sweep(ctx, t0.Add(time.Hour)); err != nil || n != 2 {
		t.Fatalf("Sweep at +1h: %d, %v; want 2", n, err)
	}
	replays("x", t0.Add(time.Hour), "")
	replays("d", t0.Add(time.Hour), "d-late")
	if n, err := s.Sweep(ctx, t0.Add(3*time.Hour)); err != nil || n != 1 {
		t.Fatalf("Sweep at +3h: %d, %v; want 1", n, err)
	}
	s.flights.mu.Lock()
	left := s.flights.indexed()
	s.flights.mu.Unlock()
	if left != 0 {
		t.Errorf("index holds %d keys after every record was swept", left)
	}
}
