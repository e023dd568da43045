package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
)

// store is one KeyStore implementation under contract test, with a clock
// the test moves.
type store struct {
	name string
	open func(t *testing.T, now func() time.Time) idem.KeyStore
}

func stores() []store {
	return []store{
		{"memory", func(t *testing.T, now func() time.Time) idem.KeyStore {
			s := idem.NewMemoryStore()
			s.SetNow(now)
			return s
		}},
		{"bolt", func(t *testing.T, now func() time.Time) idem.KeyStore {
			s, err := idem.OpenBoltStore(filepath.Join(t.TempDir(), "journal.db"), nil)
			if err != nil {
				t.Fatal(err)
			}
			s.SetNow(now)
			t.Cleanup(func() { _ = s.Close() })
			return s
		}},
	}
}

// clock is a settable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func newOp(key string) idem.Operation {
	return idem.Operation{
		Key: key, Method: http.MethodPost, URL: "https://api.example.com/v1/charges",
		Scope: "POST api.example.com", Fingerprint: [32]byte{1, byte(len(key))},
		Owner:  "test",
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(`{"amount":42,"key":"` + key + `"}`),
	}
}

// sameOp compares the fields a store keeps, times by instant.
func sameOp(t *testing.T, got, want idem.Operation) {
	t.Helper()
	if got.Key != want.Key || got.Name != want.Name || got.Method != want.Method || got.URL != want.URL ||
		got.Scope != want.Scope || got.Fingerprint != want.Fingerprint || got.State != want.State ||
		got.Attempts != want.Attempts || got.LastStatus != want.LastStatus || got.LastError != want.LastError ||
		got.Owner != want.Owner || !got.Created.Equal(want.Created) || !got.LeaseUntil.Equal(want.LeaseUntil) ||
		!bytes.Equal(got.Body, want.Body) || fmt.Sprint(got.Header) != fmt.Sprint(want.Header) {
		t.Fatalf("record differs:\n got %+v\nwant %+v", got, want)
	}
}

func mustReserve(t *testing.T, s idem.KeyStore, op idem.Operation) idem.Operation {
	t.Helper()
	rec, created, err := s.Reserve(t.Context(), op)
	if err != nil || !created {
		t.Fatalf("Reserve(%s): created=%v err=%v, want a new record", op.Key, created, err)
	}
	return rec
}

func keys(ops []idem.Operation) []string {
	var ks []string
	for _, op := range ops {
		ks = append(ks, op.Key)
	}
	return ks
}

func TestKeyStoreContract(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, s idem.KeyStore, c *clock)
	}{
		{"reserve creates then returns existing unchanged", func(t *testing.T, s idem.KeyStore, c *clock) {
			ctx := t.Context()
			op := newOp("k1")
			rec := mustReserve(t, s, op)
			want := op
			want.State, want.Created = idem.StatePending, c.now()
			sameOp(t, rec, want)
			if !rec.Updated.Equal(c.now()) {
				t.Errorf("Updated = %v, want %v", rec.Updated, c.now())
			}

			other := newOp("k1")
			other.Body, other.Fingerprint = []byte("different"), [32]byte{9}
			c.add(time.Second)
			got, created, err := s.Reserve(ctx, other)
			if err != nil || created {
				t.Fatalf("second Reserve: created=%v err=%v", created, err)
			}
			sameOp(t, got, want)
			stored, err := s.Get(ctx, "k1")
			if err != nil {
				t.Fatal(err)
			}
			sameOp(t, stored, want)
		}},
		{"reserve by name returns the named record", func(t *testing.T, s idem.KeyStore, c *clock) {
			ctx := t.Context()
			op := newOp("k1")
			op.Name = "pay:order-42"
			mustReserve(t, s, op)
			again := newOp("k2")
			again.Name = "pay:order-42"
			got, created, err := s.Reserve(ctx, again)
			if err != nil || created || got.Key != "k1" {
				t.Fatalf("Reserve by existing name: key=%s created=%v err=%v, want k1 existing", got.Key, created, err)
			}
			named, err := s.Named(ctx, "pay:order-42")
			if err != nil || named.Key != "k1" {
				t.Fatalf("Named: key=%s err=%v", named.Key, err)
			}
			if _, err := s.Get(ctx, "k2"); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("Get(k2): got %v, want ErrNotFound", err)
			}
			if _, err := s.Named(ctx, "other"); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("Named(other): got %v, want ErrNotFound", err)
			}
		}},
		{"reserve refuses an invalid key", func(t *testing.T, s idem.KeyStore, c *clock) {
			for _, k := range []string{"", string(make([]byte, 256))} {
				if _, _, err := s.Reserve(t.Context(), newOp(k)); !errors.Is(err, idem.ErrInvalidKey) {
					t.Errorf("Reserve(%d-byte key): got %v, want ErrInvalidKey", len(k), err)
				}
			}
		}},
		{"attempt counts and keeps pending", func(t *testing.T, s idem.KeyStore, c *clock) {
			ctx := t.Context()
			mustReserve(t, s, newOp("k1"))
			if err := s.Attempt(ctx, "k1", idem.Outcome{State: idem.StatePending, Err: "connection reset"}); err != nil {
				t.Fatal(err)
			}
			c.add(time.Second)
			if err := s.Attempt(ctx, "k1", idem.Outcome{State: idem.StatePending, Status: 503}); err != nil {
				t.Fatal(err)
			}
			got, err := s.Get(ctx, "k1")
			if err != nil {
				t.Fatal(err)
			}
			if got.Attempts != 2 || got.LastStatus != 503 || got.LastError != "" || got.State != idem.StatePending ||
				!got.Updated.Equal(c.now()) || got.Body == nil {
				t.Fatalf("after two attempts: %+v", got)
			}
			if err := s.Attempt(ctx, "nope", idem.Outcome{}); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("Attempt(unknown): got %v, want ErrNotFound", err)
			}
		}},
		{"finish drops the body and leaves pending", func(t *testing.T, s idem.KeyStore, c *clock) {
			ctx := t.Context()
			mustReserve(t, s, newOp("k1"))
			mustReserve(t, s, newOp("k2"))
			if err := s.Finish(ctx, "k1", idem.Outcome{State: idem.StatePending}); err == nil {
				t.Error("Finish with a pending state: got nil error")
			}
			if err := s.Attempt(ctx, "k1", idem.Outcome{State: idem.StatePending, Status: 503}); err != nil {
				t.Fatal(err)
			}
			if err := s.Finish(ctx, "k1", idem.Outcome{State: idem.StateSucceeded, Status: 201, Attempts: 1}); err != nil {
				t.Fatal(err)
			}
			got, err := s.Get(ctx, "k1")
			if err != nil {
				t.Fatal(err)
			}
			if got.State != idem.StateSucceeded || got.LastStatus != 201 || got.Body != nil || got.Header != nil || got.Attempts != 2 {
				t.Fatalf("after Finish: %+v", got)
			}
			pend, err := s.Pending(ctx, "", 0)
			if err != nil {
				t.Fatal(err)
			}
			if ks := keys(pend); len(ks) != 1 || ks[0] != "k2" {
				t.Fatalf("Pending after Finish = %v, want [k2]", ks)
			}
			if err := s.Finish(ctx, "nope", idem.Outcome{State: idem.StateFailed}); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("Finish(unknown): got %v, want ErrNotFound", err)
			}
		}},
		{"reopen makes a finished record pending again", func(t *testing.T, s idem.KeyStore, c *clock) {
			ctx := t.Context()
			op := newOp("k1")
			mustReserve(t, s, op)
			if err := s.Finish(ctx, "k1", idem.Outcome{State: idem.StateFailed, Status: 500}); err != nil {
				t.Fatal(err)
			}
			c.add(time.Minute)
			h := http.Header{"X-Again": {"1"}}
			got, err := s.Reopen(ctx, "k1", h, []byte("body2"))
			if err != nil {
				t.Fatal(err)
			}
			want := op
			want.State, want.Created, want.LastStatus = idem.StatePending, c.now().Add(-time.Minute), 500
			want.Header, want.Body = h, []byte("body2")
			sameOp(t, got, want)
			stored, err := s.Get(ctx, "k1")
			if err != nil {
				t.Fatal(err)
			}
			sameOp(t, stored, want)
			pend, err := s.Pending(ctx, "", 0)
			if err != nil || len(pend) != 1 {
				t.Fatalf("Pending after Reopen: %v, %v", keys(pend), err)
			}
			sameOp(t, pend[0], want)
			if _, err := s.Reopen(ctx, "nope", nil, nil); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("Reopen(unknown): got %v, want ErrNotFound", err)
			}
		}},
		{"pending is oldest first and pages", func(t *testing.T, s idem.KeyStore, c *clock) {
			ctx := t.Context()
			base := c.now()
			// Created out of key order; b and e share an instant.
			for _, x := range []struct {
				key string
				at  time.Duration
			}{{"c", 1}, {"a", 5}, {"e", 3}, {"b", 3}, {"d", 9}, {"f", 7}} {
				op := newOp(x.key)
				op.Created = base.Add(x.at * time.Second)
				mustReserve(t, s, op)
			}
			if err := s.Finish(ctx, "f", idem.Outcome{State: idem.StateSucceeded, Status: 200}); err != nil {
				t.Fatal(err)
			}
			want := []string{"c", "b", "e", "a", "d"}
			var got []string
			after := ""
			for page := 0; page < 10; page++ {
				ops, err := s.Pending(ctx, after, 2)
				if err != nil {
					t.Fatal(err)
				}
				if len(ops) > 2 {
					t.Fatalf("page of %d records, limit 2", len(ops))
				}
				if len(ops) == 0 {
					break
				}
				for _, op := range ops {
					if op.Body == nil {
						t.Errorf("pending %s without its body", op.Key)
					}
				}
				got = append(got, keys(ops)...)
				after = ops[len(ops)-1].Key
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("Pending pages = %v, want %v", got, want)
			}
			// A finished record still marks a place to continue from.
			ops, err := s.Pending(ctx, "f", 0)
			if err != nil || fmt.Sprint(keys(ops)) != "[d]" {
				t.Fatalf("Pending(after f) = %v, %v, want [d]", keys(ops), err)
			}
			if _, err := s.Pending(ctx, "nope", 0); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("Pending(after unknown): got %v, want ErrNotFound", err)
			}
		}},
		{"sweep deletes old finished records only", func(t *testing.T, s idem.KeyStore, c *clock) {
			ctx := t.Context()
			for _, k := range []string{"old1", "old2", "oldpending", "new"} {
				op := newOp(k)
				op.Name = "name-" + k
				mustReserve(t, s, op)
			}
			for _, k := range []string{"old1", "old2"} {
				if err := s.Finish(ctx, k, idem.Outcome{State: idem.StateSucceeded, Status: 200}); err != nil {
					t.Fatal(err)
				}
			}
			c.add(time.Hour)
			if err := s.Finish(ctx, "new", idem.Outcome{State: idem.StateFailed, Status: 400}); err != nil {
				t.Fatal(err)
			}
			n, err := s.Sweep(ctx, c.now().Add(-time.Minute))
			if err != nil || n != 2 {
				t.Fatalf("Sweep = %d, %v, want 2", n, err)
			}
			for _, k := range []string{"old1", "old2"} {
				if _, err := s.Get(ctx, k); !errors.Is(err, idem.ErrNotFound) {
					t.Errorf("Get(%s) after Sweep: %v, want ErrNotFound", k, err)
				}
				if _, err := s.Named(ctx, "name-"+k); !errors.Is(err, idem.ErrNotFound) {
					t.Errorf("Named(%s) after Sweep: %v, want ErrNotFound", k, err)
				}
				// The name is free again.
				op := newOp(k + "-again")
				op.Name = "name-" + k
				mustReserve(t, s, op)
			}
			for _, k := range []string{"oldpending", "new"} {
				if _, err := s.Get(ctx, k); err != nil {
					t.Errorf("Get(%s) after Sweep: %v", k, err)
				}
			}
			if n, err := s.Sweep(ctx, c.now().Add(-time.Minute)); err != nil || n != 0 {
				t.Fatalf("second Sweep = %d, %v, want 0", n, err)
			}
		}},
		{"every method fails after close", func(t *testing.T, s idem.KeyStore, c *clock) {
			ctx := t.Context()
			mustReserve(t, s, newOp("k1"))
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			_, _, errReserve := s.Reserve(ctx, newOp("k2"))
			_, errReopen := s.Reopen(ctx, "k1", nil, nil)
			_, errGet := s.Get(ctx, "k1")
			_, errNamed := s.Named(ctx, "x")
			_, errPending := s.Pending(ctx, "", 0)
			_, errSweep := s.Sweep(ctx, c.now())
			for name, err := range map[string]error{
				"Reserve": errReserve, "Reopen": errReopen, "Get": errGet, "Named": errNamed,
				"Attempt": s.Attempt(ctx, "k1", idem.Outcome{}),
				"Finish":  s.Finish(ctx, "k1", idem.Outcome{State: idem.StateSucceeded}),
				"Pending": errPending, "Sweep": errSweep, "Close": s.Close(),
			} {
				if !errors.Is(err, idem.ErrClosed) {
					t.Errorf("%s after Close: got %v, want ErrClosed", name, err)
				}
			}
		}},
		{"cancelled context", func(t *testing.T, s idem.KeyStore, c *clock) {
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			if _, _, err := s.Reserve(ctx, newOp("k1")); !errors.Is(err, context.Canceled) {
				t.Errorf("Reserve: got %v, want context.Canceled", err)
			}
			if _, err := s.Get(t.Context(), "k1"); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("a cancelled Reserve wrote its record: %v", err)
			}
		}},
	}
	for _, st := range stores() {
		t.Run(st.name, func(t *testing.T) {
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					c := newClock()
					tc.run(t, st.open(t, c.now), c)
				})
			}
		})
	}
}

func TestKeyStoreConcurrentReserveSameKey(t *testing.T) {
	for _, st := range stores() {
		t.Run(st.name, func(t *testing.T) {
			s := st.open(t, time.Now)
			const n = 64
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				created int
				seen    = map[string]int{}
			)
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					<-start
					op := newOp(fmt.Sprint("key-", i%2)) // two keys, one name
					op.Name = "the-one"
					rec, c, err := s.Reserve(t.Context(), op)
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
				})
			}
			close(start)
			wg.Wait()
			if created != 1 || len(seen) != 1 {
				t.Fatalf("%d callers created a record and they saw keys %v; want exactly one record", created, seen)
			}
		})
	}
}
