package storetest

// The contract tests, each run with a store of its own.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem/idemstore"
)

// tests are the contract tests. A test that needs a capability the store
// lacks skips itself; none is special-cased by name.
var tests = []struct {
	name string
	run  func(t T, h *harness)
}{
	{"Reserve creates a record and returns it", func(t T, h *harness) {
		op := NewOperation("k1")
		op.Host = "pay.internal"
		op.Redacted = true
		rec := h.reserve(t, op)
		same(t, "Reserve", rec, op)
		same(t, "Get", h.get(t, "k1"), op)
	}},
	{"Reserve keeps the times it is given, and reads no clock", func(t T, h *harness) {
		op := NewOperation("k1")
		op.Created, op.Updated = base.Add(-48*time.Hour), base.Add(-47*time.Hour)
		op.LeaseUntil = base.Add(-46 * time.Hour)
		same(t, "Reserve", h.reserve(t, op), op)
		same(t, "Get", h.get(t, "k1"), op)
	}},
	{"the key header travels with the record", func(t T, h *harness) {
		op := NewOperation("k1")
		op.KeyHeader = "PayPal-Request-Id"
		op.Name = "pay:kh"
		same(t, "Reserve", h.reserve(t, op), op)
		same(t, "Get", h.get(t, "k1"), op)
		h.finish(t, "k1", idemstore.Outcome{State: idemstore.StateSucceeded, Status: 201, At: base.Add(time.Second)})
		if got := h.get(t, "k1"); got.KeyHeader != op.KeyHeader {
			t.Fatalf("KeyHeader after Finish = %q, want %q", got.KeyHeader, op.KeyHeader)
		}
		plain := NewOperation("k2")
		same(t, "a record without a key header", h.reserve(t, plain), plain)
	}},
	{"a header value reads back byte for byte, obs-text too", func(t T, h *harness) {
		// net/http sends bytes 0x80-0xff in a header value as they are
		// (RFC 9110 obs-text); a resend must carry the same bytes, not
		// U+FFFD, or a server that fingerprints headers sees another
		// payload.
		op := NewOperation("k1")
		op.Header = http.Header{"X-Note": {"caf\xe9", "\xff\xfe"}, "Content-Type": {"application/json"}}
		same(t, "Reserve", h.reserve(t, op), op)
		same(t, "Get", h.get(t, "k1"), op)
	}},
	{"Reserve returns an existing key unchanged", func(t T, h *harness) {
		op := NewOperation("k1")
		h.reserve(t, op)
		other := NewOperation("k1")
		other.Body, other.Fingerprint, other.Owner = []byte("different"), [32]byte{9}, "owner-b"
		got, created, err := h.s.Reserve(t.Context(), other)
		if err != nil || created {
			t.Fatalf("second Reserve: created=%v err=%v, want the existing record", created, err)
		}
		same(t, "second Reserve", got, op)
		same(t, "Get", h.get(t, "k1"), op)
	}},
	{"Reserve by name returns the named record", func(t T, h *harness) {
		op := NewOperation("k1")
		op.Name = "pay:order-42"
		h.reserve(t, op)
		again := NewOperation("k2")
		again.Name = "pay:order-42"
		got, created, err := h.s.Reserve(t.Context(), again)
		if err != nil || created {
			t.Fatalf("Reserve with a known name: created=%v err=%v", created, err)
		}
		same(t, "Reserve by name", got, op)
		if _, err := h.s.Get(t.Context(), "k2"); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("Get(k2) = %v, want ErrNotFound: a name has one key", err)
		}
		other := NewOperation("k3")
		other.Name = "pay:order-43"
		h.reserve(t, other)
	}},
	{"Reserve keeps a finished record as given", func(t T, h *harness) {
		op := NewOperation("k1")
		op.State, op.LastStatus = idemstore.StateFailed, 0
		op.LastError = "not sent"
		op.URL = "https://api.example.com/v1/charges"
		op.Owner, op.LeaseUntil = "", time.Time{}
		op.Header, op.Body = nil, nil // the journal keeps no request for a finished record
		same(t, "Reserve", h.reserve(t, op), op)
		same(t, "Get", h.get(t, "k1"), op)
		ops, err := h.s.Pending(t.Context(), "", 0)
		wantKeys(t, "Pending", ops, err)
	}},
	{"one name, one key under 64 concurrent reservations", func(t T, h *harness) {
		const n = 64
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			created int
			seen    = map[string]int{}
		)
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				op := NewOperation(fmt.Sprintf("key-%02d", i))
				op.Name = "the-one"
				rec, c, err := h.s.Reserve(context.Background(), op)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				seen[rec.Key]++
				if c {
					created++
				}
			}()
		}
		close(start)
		wg.Wait()
		if created != 1 || len(seen) != 1 {
			t.Fatalf("%d callers created a record, and they saw keys %v; want exactly one", created, seen)
		}
	}},
	{"one key, one record under 64 concurrent reservations", func(t T, h *harness) {
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			created int
		)
		start := make(chan struct{})
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, c, err := h.s.Reserve(context.Background(), NewOperation("same"))
				if err != nil {
					t.Error(err)
					return
				}
				if c {
					mu.Lock()
					created++
					mu.Unlock()
				}
			}()
		}
		close(start)
		wg.Wait()
		if created != 1 {
			t.Fatalf("%d callers created the record, want 1", created)
		}
	}},
	{"Attempt counts requests and keeps the operation pending", func(t T, h *harness) {
		ctx := t.Context()
		op := NewOperation("k1")
		h.reserve(t, op)
		a1 := idemstore.Attempt{Sent: 1, Err: "connection reset", Reason: "network error", At: base.Add(time.Second)}
		a2 := idemstore.Attempt{Sent: 2, Status: 503, Reason: "503", At: base.Add(2 * time.Second)}
		for _, a := range []idemstore.Attempt{a1, a2} {
			if err := h.s.Attempt(ctx, "k1", a); err != nil {
				t.Fatal(err)
			}
		}
		want := op
		want.Attempts, want.LastStatus = 3, 503
		want.Updated = base.Add(2 * time.Second)
		want.History = []idemstore.Attempt{a1, a2}
		same(t, "after two Attempts", h.get(t, "k1"), want)
		if err := h.s.Attempt(ctx, "nope", idemstore.Attempt{Sent: 1}); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("Attempt(unknown) = %v, want ErrNotFound", err)
		}
	}},
	{"Finish records the outcome and drops the request", func(t T, h *harness) {
		ctx := t.Context()
		op := NewOperation("k1")
		op.Name = "pay:1"
		op.URL += "#receipt"
		h.reserve(t, op)
		a := idemstore.Attempt{Sent: 1, Status: 503, Reason: "503", At: base.Add(time.Second)}
		if err := h.s.Attempt(ctx, "k1", a); err != nil {
			t.Fatal(err)
		}
		// The journal computes the URL a finished record keeps; the store
		// writes the one it is given, here one that no store could derive
		// from the record's own.
		finished := "https://api.example.com/v1/charges/(finished)"
		h.finish(t, "k1", idemstore.Outcome{State: idemstore.StateSucceeded, Status: 201, Sent: 1, URL: finished, At: base.Add(2 * time.Second)})
		got := h.get(t, "k1")
		want := op
		want.State, want.Attempts, want.LastStatus = idemstore.StateSucceeded, 2, 201
		want.Updated = base.Add(2 * time.Second)
		want.Header, want.Body = nil, nil
		want.URL = finished
		want.History = []idemstore.Attempt{a} // kept by Finish
		want.LeaseUntil = got.LeaseUntil      // checked below
		same(t, "finished", got, want)
		if got.LeaseUntil.After(base.Add(2 * time.Second)) {
			t.Errorf("LeaseUntil = %v after Finish, want the lease ended", got.LeaseUntil)
		}
		ops, err := h.s.Pending(ctx, "", 0)
		wantKeys(t, "Pending after Finish", ops, err)
		if err := h.s.Finish(ctx, "nope", idemstore.Outcome{State: idemstore.StateFailed}); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("Finish(unknown) = %v, want ErrNotFound", err)
		}
	}},
	{"a mark from an owner that lost the record changes nothing", func(t T, h *harness) {
		// Owner A sends, then stalls past its lease; B takes the operation
		// over (Claim for k1, Acquire for k2), resends it and finishes it.
		// A's late Attempt and Finish must leave B's record as it is: a
		// late "failed" over B's "succeeded" has an operator charge twice.
		ctx := t.Context()
		for _, k := range []string{"k1", "k2"} {
			h.reserve(t, NewOperation(k)) // owner-a, its lease ends at base+1h
		}
		later := base.Add(2 * time.Hour)
		l := lease("owner-b", later, time.Hour)
		ops, err := h.s.Claim(ctx, l, "", 1)
		wantKeys(t, "Claim by owner-b after owner-a's lease lapsed", ops, err, "k1")
		if _, err := h.s.Acquire(ctx, "k2", l, idemstore.Request{}); err != nil {
			t.Fatalf("Acquire by owner-b after owner-a's lease lapsed: %v", err)
		}
		for _, k := range []string{"k1", "k2"} {
			taken := h.get(t, k)
			if taken.Owner != "owner-b" {
				t.Fatalf("%s: owner %q after owner-b took it", k, taken.Owner)
			}
			late := idemstore.Attempt{Sent: 1, Status: 503, Reason: "503", At: later.Add(time.Second), Owner: "owner-a"}
			if err := h.s.Attempt(ctx, k, late); err != nil {
				t.Fatalf("%s: owner-a's late Attempt = %v, want nil (it changes nothing)", k, err)
			}
			if err := h.s.Finish(ctx, k, idemstore.Outcome{State: idemstore.StateFailed, Status: 503, Sent: 1, URL: idemstore.TrimQuery(taken.URL), At: later.Add(2 * time.Second), Owner: "owner-a"}); err != nil {
				t.Fatalf("%s: owner-a's late Finish = %v, want nil (it changes nothing)", k, err)
			}
			same(t, k+": after owner-a's late marks, owner-b's record", h.get(t, k), taken)
			ops, err := h.s.Pending(ctx, k[:1], 0)
			if err != nil || !slices.Contains(keysOf(ops), k) {
				t.Fatalf("%s: Pending after owner-a's late Finish = %v, %v: want it still pending", k, keysOf(ops), err)
			}
			// B's own marks apply, and its outcome stands.
			mine := idemstore.Attempt{Sent: 1, Status: 502, Reason: "502", At: later.Add(3 * time.Second), Owner: "owner-b"}
			if err := h.s.Attempt(ctx, k, mine); err != nil {
				t.Fatal(err)
			}
			h.finish(t, k, idemstore.Outcome{State: idemstore.StateSucceeded, Status: 201, Sent: 1, URL: idemstore.TrimQuery(taken.URL), At: later.Add(4 * time.Second), Owner: "owner-b"})
			done := h.get(t, k)
			want := taken
			want.State, want.Attempts, want.LastStatus = idemstore.StateSucceeded, 2, 201
			want.URL, want.Header, want.Body = idemstore.TrimQuery(taken.URL), nil, nil
			want.Updated, want.LeaseUntil = later.Add(4*time.Second), done.LeaseUntil
			want.History = []idemstore.Attempt{{Sent: 1, Status: 502, Reason: "502", At: mine.At}}
			same(t, k+": owner-b's finished record", done, want)
			// A finished record is not changed by a later mark, from the
			// owner that lost it or the one that finished it.
			for _, owner := range []string{"owner-a", "owner-b"} {
				if err := h.s.Attempt(ctx, k, idemstore.Attempt{Sent: 1, Status: 503, Reason: "503", At: later.Add(5 * time.Second), Owner: owner}); err != nil {
					t.Fatalf("%s: %s's Attempt on the finished record = %v, want nil", k, owner, err)
				}
				if err := h.s.Finish(ctx, k, idemstore.Outcome{State: idemstore.StateFailed, Status: 500, Sent: 1, URL: want.URL, At: later.Add(6 * time.Second), Owner: owner}); err != nil {
					t.Fatalf("%s: %s's Finish of the finished record = %v, want nil", k, owner, err)
				}
				same(t, k+": the finished record after "+owner+"'s later marks", h.get(t, k), done)
			}
		}
	}},
	{"Acquire reopens a finished record with the request it is given", func(t T, h *harness) {
		ctx := t.Context()
		op := NewOperation("k1")
		h.reserve(t, op)
		h.finish(t, "k1", idemstore.Outcome{State: idemstore.StateFailed, Status: 500, Sent: 1, URL: idemstore.TrimQuery(op.URL), At: base.Add(time.Second)})
		hdr := http.Header{"Content-Type": {"application/json"}, "X-Again": {"1"}}
		l := lease("owner-b", base.Add(time.Minute), time.Minute)
		req := idemstore.Request{URL: op.URL, Header: hdr, Body: []byte("body2")}
		got, err := h.s.Acquire(ctx, "k1", l, req)
		if err != nil {
			t.Fatal(err)
		}
		want := op // its URL again, with the query the finished record did not keep
		want.Attempts, want.LastStatus = 1, 500
		want.Owner, want.LeaseUntil = "owner-b", l.Until
		want.Updated = l.At
		want.Header, want.Body = hdr, []byte("body2")
		same(t, "Acquire", got, want)
		same(t, "Get after Acquire", h.get(t, "k1"), want)
		ops, err := h.s.Pending(ctx, "", 0)
		wantKeys(t, "Pending after Acquire", ops, err, "k1")
		if _, err := h.s.Acquire(ctx, "nope", l, idemstore.Request{}); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("Acquire(unknown) = %v, want ErrNotFound", err)
		}
	}},
	{"Acquire respects a live lease and takes a lapsed one", func(t T, h *harness) {
		ctx := t.Context()
		now := base
		op := NewOperation("k1")
		op.Owner, op.LeaseUntil = "owner-a", now.Add(time.Minute)
		h.reserve(t, op)
		if _, err := h.s.Acquire(ctx, "k1", lease("owner-b", now, time.Minute), idemstore.Request{}); !errors.Is(err, idemstore.ErrInProgress) {
			t.Fatalf("Acquire under another's live lease = %v, want ErrInProgress", err)
		}
		same(t, "after a refused Acquire", h.get(t, "k1"), op)
		// The owner itself may acquire again.
		mine, err := h.s.Acquire(ctx, "k1", lease("owner-a", now, 2*time.Minute), idemstore.Request{})
		if err != nil {
			t.Fatalf("Acquire by the owner: %v", err)
		}
		want := op
		want.LeaseUntil = now.Add(2 * time.Minute)
		want.Updated = now
		same(t, "Acquire by the owner keeps the request", mine, want)
		// After the lease lapsed, anyone may.
		later := now.Add(3 * time.Minute)
		got, err := h.s.Acquire(ctx, "k1", lease("owner-b", later, time.Minute), idemstore.Request{})
		if err != nil {
			t.Fatalf("Acquire after the lease lapsed: %v", err)
		}
		want.Owner, want.LeaseUntil = "owner-b", later.Add(time.Minute)
		want.Updated = later
		same(t, "Acquire of a lapsed lease", got, want)
	}},
	{"Renew extends the owner's lease only", func(t T, h *harness) {
		ctx := t.Context()
		now := base
		op := NewOperation("k1")
		op.Owner, op.LeaseUntil = "owner-a", now.Add(time.Minute)
		h.reserve(t, op)
		if err := h.s.Renew(ctx, "k1", lease("owner-a", now, 5*time.Minute)); err != nil {
			t.Fatal(err)
		}
		if got := h.get(t, "k1").LeaseUntil; !got.Equal(now.Add(5 * time.Minute)) {
			t.Fatalf("LeaseUntil = %v after Renew, want %v", got, now.Add(5*time.Minute))
		}
		if err := h.s.Renew(ctx, "k1", lease("owner-b", now, time.Hour)); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Fatalf("Renew by another owner = %v, want ErrLeaseLost", err)
		}
		// Releasing: a lease until its own start lets others take it at once.
		if err := h.s.Renew(ctx, "k1", lease("owner-a", now, 0)); err != nil {
			t.Fatal(err)
		}
		if _, err := h.s.Acquire(ctx, "k1", lease("owner-b", now.Add(time.Millisecond), time.Minute), idemstore.Request{}); err != nil {
			t.Fatalf("Acquire after release: %v", err)
		}
		h.finish(t, "k1", idemstore.Outcome{State: idemstore.StateSucceeded, Status: 200, Sent: 1, At: now.Add(time.Second)})
		if err := h.s.Renew(ctx, "k1", lease("owner-b", now, time.Hour)); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Fatalf("Renew of a finished operation = %v, want ErrLeaseLost", err)
		}
		if err := h.s.Renew(ctx, "nope", lease("owner-b", now, time.Hour)); !errors.Is(err, idemstore.ErrNotFound) && !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Fatalf("Renew(unknown) = %v, want ErrNotFound or ErrLeaseLost", err)
		}
	}},
	{"Pending is in key order and pages", func(t T, h *harness) {
		ctx := t.Context()
		for _, k := range []string{"c", "a", "e", "b", "d", "f"} {
			h.reserve(t, NewOperation(k))
		}
		h.finish(t, "d", idemstore.Outcome{State: idemstore.StateSucceeded, Status: 200, Sent: 1, At: base.Add(time.Second)})
		var got []string
		after := ""
		for range 10 {
			ops, err := h.s.Pending(ctx, after, 2)
			if err != nil {
				t.Fatal(err)
			}
			if len(ops) > 2 {
				t.Fatalf("Pending(limit 2) returned %d records", len(ops))
			}
			if len(ops) == 0 {
				break
			}
			for _, op := range ops {
				if op.State != idemstore.StatePending || len(op.Body) == 0 {
					t.Fatalf("Pending returned %s in state %v with body %q", op.Key, op.State, op.Body)
				}
			}
			got = append(got, keysOf(ops)...)
			after = ops[len(ops)-1].Key
		}
		if want := []string{"a", "b", "c", "e", "f"}; !slices.Equal(got, want) {
			t.Fatalf("pages = %v, want %v", got, want)
		}
		ops, err := h.s.Pending(ctx, "bb", 0)
		wantKeys(t, "Pending after a key not in the journal", ops, err, "c", "e", "f")
		ops, err = h.s.Pending(ctx, "", 0)
		wantKeys(t, "Pending with no limit", ops, err, "a", "b", "c", "e", "f")
		// Pending changes nothing.
		if got := h.get(t, "a"); got.Owner != "owner-a" {
			t.Fatalf("Pending changed the owner to %q", got.Owner)
		}
	}},
	{"Claim takes its own and lapsed operations, never a live lease", func(t T, h *harness) {
		ctx := t.Context()
		now := base
		for _, c := range []struct {
			key, owner string
			until      time.Time
		}{
			{"a", "me", now.Add(time.Minute)},     // mine
			{"b", "other", now.Add(time.Minute)},  // live elsewhere
			{"c", "other", now.Add(-time.Second)}, // lapsed
			{"d", "", time.Time{}},                // never leased
			{"e", "other", now.Add(time.Hour)},    // live elsewhere
		} {
			op := NewOperation(c.key)
			op.Owner, op.LeaseUntil = c.owner, c.until
			h.reserve(t, op)
		}
		l := lease("me", now, 30*time.Second)
		ops, err := h.s.Claim(ctx, l, "", 0)
		wantKeys(t, "Claim", ops, err, "a", "c", "d")
		for _, op := range ops {
			if op.Owner != "me" || !op.LeaseUntil.Equal(l.Until) || len(op.Body) == 0 {
				t.Fatalf("claimed %s: owner %q until %v body %q; want owner me until %v with body", op.Key, op.Owner, op.LeaseUntil, op.Body, l.Until)
			}
			if got := h.get(t, op.Key); got.Owner != "me" || !got.LeaseUntil.Equal(l.Until) {
				t.Fatalf("stored %s: owner %q until %v after Claim", op.Key, got.Owner, got.LeaseUntil)
			}
		}
		if got := h.get(t, "b"); got.Owner != "other" {
			t.Fatalf("Claim changed b's owner to %q", got.Owner)
		}
		ops, err = h.s.Claim(ctx, l, "a", 1)
		wantKeys(t, "Claim after a, limit 1", ops, err, "c")
		// Another owner now finds a, c, d leased to me.
		ops, err = h.s.Claim(ctx, lease("third", now, time.Minute), "", 0)
		wantKeys(t, "Claim by a third owner", ops, err)
		// Once every lease lapsed, everything is claimable.
		ops, err = h.s.Claim(ctx, lease("third", now.Add(2*time.Hour), time.Minute), "", 0)
		wantKeys(t, "Claim after every lease lapsed", ops, err, "a", "b", "c", "d", "e")
	}},
	{"concurrent Claims share out the operations", func(t T, h *harness) {
		now := base
		const n = 40
		for i := range n {
			op := NewOperation(fmt.Sprintf("op-%02d", i))
			op.Owner, op.LeaseUntil = "", time.Time{}
			h.reserve(t, op)
		}
		var (
			wg  sync.WaitGroup
			mu  sync.Mutex
			got = map[string][]string{}
		)
		for _, owner := range []string{"r1", "r2", "r3", "r4"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				after := ""
				for {
					ops, err := h.s.Claim(context.Background(), lease(owner, now, time.Minute), after, 3)
					if err != nil {
						t.Error(err)
						return
					}
					if len(ops) == 0 {
						return
					}
					mu.Lock()
					for _, op := range ops {
						got[op.Key] = append(got[op.Key], owner)
					}
					mu.Unlock()
					after = ops[len(ops)-1].Key
				}
			}()
		}
		wg.Wait()
		for k, owners := range got {
			if len(owners) != 1 {
				t.Errorf("%s was claimed by %v at once", k, owners)
			}
		}
		if len(got) != n {
			t.Errorf("%d of %d operations were claimed", len(got), n)
		}
	}},
	{"Sweep deletes finished records before the cutoff only", func(t T, h *harness) {
		ctx := t.Context()
		for _, k := range []string{"old1", "old2", "pend"} {
			op := NewOperation(k)
			op.Name = "name-" + k
			h.reserve(t, op)
		}
		h.finish(t, "old1", idemstore.Outcome{State: idemstore.StateSucceeded, Status: 200, Sent: 1, At: base.Add(time.Minute)})
		h.finish(t, "old2", idemstore.Outcome{State: idemstore.StateExpired, At: base.Add(2 * time.Minute)})
		if n, err := h.s.Sweep(ctx, base.Add(time.Minute)); err != nil || n != 0 {
			t.Fatalf("Sweep with a cutoff at the first finish = %d, %v; want 0", n, err)
		}
		if n, err := h.s.Sweep(ctx, base.Add(time.Hour)); err != nil || n != 2 {
			t.Fatalf("Sweep = %d, %v; want 2", n, err)
		}
		for _, k := range []string{"old1", "old2"} {
			if _, err := h.s.Get(ctx, k); !errors.Is(err, idemstore.ErrNotFound) {
				t.Errorf("Get(%s) after Sweep = %v, want ErrNotFound", k, err)
			}
		}
		h.get(t, "pend")
		// The swept name is free again; the pending one's is not.
		fresh := NewOperation("new1")
		fresh.Name = "name-old1"
		h.reserve(t, fresh)
		taken := NewOperation("new2")
		taken.Name = "name-pend"
		if rec, created, err := h.s.Reserve(ctx, taken); err != nil || created || rec.Key != "pend" {
			t.Fatalf("Reserve of a pending name: key %s created %v err %v", rec.Key, created, err)
		}
		if n, err := h.s.Sweep(ctx, base.Add(time.Hour)); err != nil || n != 0 {
			t.Fatalf("second Sweep = %d, %v; want 0", n, err)
		}
	}},
	{"a PolicyStore keeps the policy", func(t T, h *harness) {
		ps, ok := h.s.(idemstore.PolicyStore)
		if !ok {
			t.Skip("storetest: the store is no idem.PolicyStore")
		}
		ctx := t.Context()
		if p, err := ps.Policy(ctx); err != nil || p != (idemstore.Policy{}) {
			t.Fatalf("Policy of a new store = %+v, %v; want the zero Policy and no error", p, err)
		}
		want := idemstore.Policy{KeyHeader: "PayPal-Request-Id", ResendWindow: 47 * time.Hour, Retention: 48 * time.Hour, MatchWindow: 2 * time.Minute}
		if err := ps.SetPolicy(ctx, want); err != nil {
			t.Fatal(err)
		}
		if p, err := ps.Policy(ctx); err != nil || p != want {
			t.Fatalf("Policy = %+v, %v; want %+v", p, err, want)
		}
		want.ResendWindow = time.Hour
		if err := ps.SetPolicy(ctx, want); err != nil {
			t.Fatal(err)
		}
		if p, err := ps.Policy(ctx); err != nil || p != want {
			t.Fatalf("Policy after a second SetPolicy = %+v, %v; want %+v", p, err, want)
		}
		if h.Reopen == nil {
			return
		}
		if err := h.s.Close(); err != nil {
			t.Fatal(err)
		}
		h.s = h.Reopen(h.tt, h.s)
		if p, err := h.s.(idemstore.PolicyStore).Policy(ctx); err != nil || p != want {
			t.Fatalf("Policy after reopening = %+v, %v; want %+v", p, err, want)
		}
	}},
	{"an Inspector finds records by name and walks every state", func(t T, h *harness) {
		in, ok := h.s.(idemstore.Inspector)
		if !ok {
			t.Skip("storetest: the store is no idem.Inspector")
		}
		ctx := t.Context()
		for _, k := range []string{"c", "a", "b"} {
			op := NewOperation(k)
			op.Name = "pay:" + k
			h.reserve(t, op)
		}
		h.finish(t, "b", idemstore.Outcome{State: idemstore.StateSucceeded, Status: 201, Sent: 1, At: base.Add(time.Second)})
		got, err := in.Named(ctx, "pay:b")
		if err != nil || got.Key != "b" || got.State != idemstore.StateSucceeded {
			t.Fatalf("Named(pay:b) = %s %v, %v; want b, succeeded", got.Key, got.State, err)
		}
		if _, err := in.Named(ctx, "pay:none"); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("Named of an unknown name = %v, want ErrNotFound", err)
		}
		ops, err := in.Walk(ctx, "", 0)
		wantKeys(t, "Walk", ops, err, "a", "b", "c")
		for _, op := range ops {
			if op.Body != nil {
				t.Fatalf("Walk returned %s with its body", op.Key)
			}
		}
		ops, err = in.Walk(ctx, "a", 1)
		wantKeys(t, "Walk after a, limit 1", ops, err, "b")
	}},
	{"Attempt keeps a bounded history, oldest dropped first", func(t T, h *harness) {
		ctx := t.Context()
		op := NewOperation("k1")
		h.reserve(t, op)
		var all []idemstore.Attempt
		for i := range idemstore.MaxHistory + 3 {
			a := idemstore.Attempt{Sent: 1, Status: 500 + i%5, Reason: fmt.Sprintf("reason %d", i), At: base.Add(time.Duration(i+1) * time.Second)}
			if i%2 == 1 {
				a.Status, a.Err = 0, fmt.Sprintf("connection reset %d", i)
			}
			if err := h.s.Attempt(ctx, "k1", a); err != nil {
				t.Fatal(err)
			}
			all = append(all, a)
			if i == 2 {
				if got := h.get(t, "k1").History; historyString(got) != historyString(all) {
					t.Fatalf("History after 3 attempts = %s, want %s", historyString(got), historyString(all))
				}
			}
		}
		want := op
		want.Attempts = len(all)
		want.LastStatus, want.LastError = all[len(all)-1].Status, all[len(all)-1].Err
		want.Updated = all[len(all)-1].At
		want.History = all[len(all)-idemstore.MaxHistory:] // the oldest three are gone
		same(t, "after MaxHistory+3 attempts", h.get(t, "k1"), want)
	}},
	{"the history and the trace are kept by Finish and Acquire", func(t T, h *harness) {
		ctx := t.Context()
		op := NewOperation("k1")
		op.Trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		same(t, "Reserve with a trace", h.reserve(t, op), op)
		a := idemstore.Attempt{Sent: 1, Err: "EOF", Reason: "connection closed", At: base.Add(time.Second)}
		if err := h.s.Attempt(ctx, "k1", a); err != nil {
			t.Fatal(err)
		}
		h.finish(t, "k1", idemstore.Outcome{State: idemstore.StateFailed, Status: 500, Sent: 1, URL: idemstore.TrimQuery(op.URL), At: base.Add(2 * time.Second)})
		got := h.get(t, "k1")
		if got.Trace != op.Trace || historyString(got.History) != historyString([]idemstore.Attempt{a}) {
			t.Fatalf("after Finish: Trace %q History %s, want %q %s", got.Trace, historyString(got.History), op.Trace, historyString([]idemstore.Attempt{a}))
		}
		l := lease("owner-b", base.Add(time.Minute), time.Minute)
		got, err := h.s.Acquire(ctx, "k1", l, idemstore.Request{URL: op.URL, Header: op.Header, Body: op.Body})
		if err != nil {
			t.Fatal(err)
		}
		want := op
		want.Attempts, want.LastStatus, want.LastError = 2, 500, ""
		want.Owner, want.LeaseUntil, want.Updated = "owner-b", l.Until, l.At
		want.History = []idemstore.Attempt{a}
		same(t, "Acquire", got, want)
		same(t, "Get after Acquire", h.get(t, "k1"), want)
		b := idemstore.Attempt{Sent: 1, Status: 503, Reason: "503", At: base.Add(2 * time.Minute)}
		if err := h.s.Attempt(ctx, "k1", b); err != nil {
			t.Fatal(err)
		}
		if got := h.get(t, "k1"); historyString(got.History) != historyString([]idemstore.Attempt{a, b}) {
			t.Fatalf("an attempt after the reopening: History %s, want %s", historyString(got.History), historyString([]idemstore.Attempt{a, b}))
		}
		if err := h.s.Renew(ctx, "k1", lease("owner-b", base.Add(3*time.Minute), time.Minute)); err != nil {
			t.Fatal(err)
		}
		if got := h.get(t, "k1"); got.Trace != op.Trace || len(got.History) != 2 {
			t.Fatalf("after Renew: Trace %q History %s", got.Trace, historyString(got.History))
		}
		plain := NewOperation("k2")
		same(t, "a record without a trace or history", h.reserve(t, plain), plain)
		ops, err := h.s.Pending(ctx, "", 0)
		if err != nil || len(ops) != 2 || ops[0].Trace != op.Trace || len(ops[0].History) != 2 {
			t.Fatalf("Pending: %d records, err %v; want k1 with its trace and history", len(ops), err)
		}
	}},
	{"every key the journal passes is kept", func(t T, h *harness) {
		// The journal validates keys (idemstore.CheckKey); a store keeps any
		// of them, in key order.
		keys := []string{strings.Repeat("k", 255), "!", "~", "a/b?c#d", `"quoted"`, "0190f1e2-7c3a-7d4e-8f00-aaaaaaaaaaaa"}
		for _, k := range keys {
			op := NewOperation(k)
			same(t, "Reserve", h.reserve(t, op), op)
			same(t, "Get", h.get(t, k), op)
		}
		ops, err := h.s.Pending(t.Context(), "", 0)
		wantKeys(t, "Pending", ops, err, slices.Sorted(slices.Values(keys))...)
	}},
	{"a cancelled context writes nothing", func(t T, h *harness) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, _, err := h.s.Reserve(ctx, NewOperation("k1")); !errors.Is(err, context.Canceled) {
			t.Errorf("Reserve = %v, want context.Canceled", err)
		}
		if _, err := h.s.Get(t.Context(), "k1"); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("a cancelled Reserve wrote its record: %v", err)
		}
	}},
	{"every method fails after Close", func(t T, h *harness) {
		ctx := t.Context()
		h.reserve(t, NewOperation("k1"))
		if err := h.s.Close(); err != nil {
			t.Fatal(err)
		}
		l := lease("me", base, time.Minute)
		_, _, errReserve := h.s.Reserve(ctx, NewOperation("k2"))
		_, errAcquire := h.s.Acquire(ctx, "k1", l, idemstore.Request{})
		_, errGet := h.s.Get(ctx, "k1")
		_, errPending := h.s.Pending(ctx, "", 0)
		_, errClaim := h.s.Claim(ctx, l, "", 0)
		_, errSweep := h.s.Sweep(ctx, base)
		for name, err := range map[string]error{
			"Reserve": errReserve, "Acquire": errAcquire, "Get": errGet,
			"Renew":   h.s.Renew(ctx, "k1", l),
			"Attempt": h.s.Attempt(ctx, "k1", idemstore.Attempt{Sent: 1}),
			"Finish":  h.s.Finish(ctx, "k1", idemstore.Outcome{State: idemstore.StateSucceeded}),
			"Pending": errPending, "Claim": errClaim, "Sweep": errSweep,
		} {
			if !errors.Is(err, idemstore.ErrClosed) {
				t.Errorf("%s after Close = %v, want ErrClosed", name, err)
			}
		}
	}},
	{"what was accepted survives reopening", func(t T, h *harness) {
		if h.Reopen == nil {
			t.Skip("storetest: the store has no Reopen: it keeps nothing across a restart")
		}
		ctx := t.Context()
		a, b, c := NewOperation("a"), NewOperation("b"), NewOperation("c")
		a.Name = "pay:a"
		for _, op := range []idemstore.Operation{a, b, c} {
			h.reserve(t, op)
		}
		attempt := idemstore.Attempt{Sent: 1, Status: 503, Reason: "503", At: base.Add(time.Second)}
		if err := h.s.Attempt(ctx, "a", attempt); err != nil {
			t.Fatal(err)
		}
		h.finish(t, "b", idemstore.Outcome{State: idemstore.StateSucceeded, Status: 201, Sent: 1, At: base.Add(time.Second)})
		if err := h.s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		h.s = h.Reopen(h.tt, h.s)
		wantA := a
		wantA.Attempts, wantA.LastStatus = 1, 503
		wantA.Updated = base.Add(time.Second)
		wantA.History = []idemstore.Attempt{attempt}
		same(t, "a after reopening", h.get(t, "a"), wantA)
		if got := h.get(t, "b"); got.State != idemstore.StateSucceeded || got.LastStatus != 201 || got.Body != nil {
			t.Fatalf("b after reopening: state %v status %d body %q", got.State, got.LastStatus, got.Body)
		}
		same(t, "c after reopening", h.get(t, "c"), c)
		again := NewOperation("a2")
		again.Name = "pay:a"
		if rec, created, err := h.s.Reserve(ctx, again); err != nil || created || rec.Key != "a" {
			t.Fatalf("the name did not survive: key %s created %v err %v", rec.Key, created, err)
		}
	}},
}
