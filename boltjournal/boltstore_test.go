package boltjournal_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/boltjournal"
	"github.com/idemgo/idem/idemstore"
	"github.com/idemgo/idem/internal/crashtest"
	bolt "go.etcd.io/bbolt"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func openBolt(t *testing.T, path string) *boltjournal.Store {
	t.Helper()
	s, err := boltjournal.Open(path, &boltjournal.Options{LockTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// checkFile runs bbolt's consistency check on a closed journal.
func checkFile(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatalf("bbolt consistency check: %v", err)
	}
}

func TestBoltStoreFileMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	openBolt(t, path)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("journal mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestBoltStoreSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	s, err := boltjournal.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	op := newOp("k1")
	op.Name = "n1"
	mustReserve(t, s, op)
	mustReserve(t, s, newOp("k2"))
	if err := s.Attempt(ctx, "k1", idemstore.Attempt{Sent: 1, Status: 503}); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, "k2", idemstore.Outcome{State: idemstore.StateSucceeded, Status: 200}); err != nil {
		t.Fatal(err)
	}
	// Close commits the queued Attempt and Finish.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openBolt(t, path)
	got, err := s.Named(ctx, "n1")
	if err != nil || got.Attempts != 1 || got.LastStatus != 503 || !bytes.Equal(got.Body, op.Body) {
		t.Fatalf("k1 after reopen: %+v, %v", got, err)
	}
	if got, err := s.Get(ctx, "k2"); err != nil || got.State != idemstore.StateSucceeded {
		t.Fatalf("k2 after reopen: %+v, %v", got, err)
	}
}

func TestBoltStoreLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	openBolt(t, path)
	// flock also excludes a second handle in the same process.
	s, err := boltjournal.Open(path, &boltjournal.Options{LockTimeout: 50 * time.Millisecond})
	if !errors.Is(err, idemstore.ErrJournalLocked) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("second open: got %v, want ErrJournalLocked", err)
	}
}

func init() { crashChildren["reserve"] = childReserve }

// childReserve is the child of TestCrashReserve: it reserves keys in a loop
// from several goroutines and emits each key after Reserve returned, until
// it is killed.
func childReserve() int {
	ctx := context.Background()
	s, err := boltjournal.Open(os.Getenv("IDEM_JOURNAL"), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	prefix := os.Getenv("IDEM_ROUND")
	done := make(chan struct{})
	var once sync.Once
	for g := range 4 {
		go func() {
			for i := 0; ; i++ {
				key := fmt.Sprintf("%s-%d-%d", prefix, g, i)
				op := newOp(key)
				op.Name = "name-" + key
				if _, _, err := s.Reserve(ctx, op); err != nil {
					crashtest.Emit("error", err.Error())
					once.Do(func() { close(done) })
					return
				}
				crashtest.Emit("reserved", key)
				if i%3 == 0 {
					_ = s.Finish(ctx, key, idemstore.Outcome{State: idemstore.StateSucceeded, Status: 200})
				}
			}
		}()
	}
	<-done // only on error; normally the parent kills us first
	return 1
}

func TestCrashReserve(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	for round := range 4 {
		prefix := fmt.Sprint("r", round)
		child := crashtest.Start(t, "reserve", "IDEM_JOURNAL="+path, "IDEM_ROUND="+prefix)
		lines := child.KillAfter(1 + mathrand.IntN(300))
		var reserved []string
		for _, l := range lines {
			kind, arg, _ := strings.Cut(l, " ")
			if kind != "reserved" {
				t.Fatalf("child: %s", l)
			}
			reserved = append(reserved, arg)
		}
		if len(reserved) == 0 {
			t.Fatal("child reserved nothing before it was killed")
		}
		checkFile(t, path)
		s, err := boltjournal.Open(path, nil)
		if err != nil {
			t.Fatalf("round %d: reopen after SIGKILL: %v", round, err)
		}
		for _, k := range reserved {
			op, err := s.Get(t.Context(), k)
			if err != nil {
				t.Errorf("round %d: key %s was reserved before the crash: %v", round, k, err)
				continue
			}
			if named, err := s.Named(t.Context(), "name-"+k); err != nil || named.Key != k {
				t.Errorf("round %d: name of %s: %v", round, k, err)
			}
			if op.State == idemstore.StatePending && !bytes.Equal(op.Body, newOp(k).Body) {
				t.Errorf("round %d: pending %s lost its body", round, k)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %d keys reserved before SIGKILL, all present", round, len(reserved))
	}
}

func TestBoltStoreScrubsFinishedRequests(t *testing.T) {
	const card = "4242424242424242"
	for _, tc := range []struct {
		name  string
		delay time.Duration
	}{
		{"while open", 10 * time.Millisecond},
		{"at Close", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.db")
			s, err := boltjournal.Open(path, &boltjournal.Options{ScrubDelay: tc.delay})
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			for i := range 30 {
				op := newOp(fmt.Sprintf("key-%02d", i))
				op.Body = []byte(fmt.Sprintf(`{"card":"%s","n":%d,"pad":"%s"}`, card, i, strings.Repeat("p", 40*i)))
				mustReserve(t, s, op)
				if err := s.Attempt(ctx, op.Key, idemstore.Attempt{Sent: 1, Status: 503}); err != nil {
					t.Fatal(err)
				}
			}
			pending := newOp("still-pending")
			pending.Body = []byte(`{"card":"5555444433331111"}`)
			mustReserve(t, s, pending)
			has := func(s string) bool {
				b, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				return bytes.Contains(b, []byte(s))
			}
			if !has(card) {
				t.Fatal("the card number is not in the journal at all: the test proves nothing")
			}
			for i := range 30 {
				if err := s.Finish(ctx, fmt.Sprintf("key-%02d", i), idemstore.Outcome{State: idemstore.StateSucceeded, Status: 201}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Get(ctx, "key-00"); err != nil { // the marks are committed
				t.Fatal(err)
			}
			if tc.delay > 0 {
				// Bounded: the scrub follows the finish commit by about
				// ScrubDelay; allow a loaded machine plenty more.
				deadline := time.Now().Add(10 * time.Second)
				for has(card) && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if has(card) {
					t.Fatal("the card number of finished operations is still in the journal file 10s after they finished")
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if has(card) {
				t.Fatal("the card number of finished operations is still in the journal file after Close")
			}
			if !has("5555444433331111") {
				t.Fatal("the pending operation's body is gone from the file")
			}
			checkFile(t, path)
			s2 := openBolt(t, path)
			if op, err := s2.Get(ctx, "still-pending"); err != nil || !bytes.Equal(op.Body, pending.Body) {
				t.Fatalf("pending operation after scrubbing: %+v, %v", op, err)
			}
		})
	}
}

func TestBoltStoreLargeBodies(t *testing.T) {
	// Bodies from 32 KiB on are stored apart from their record; every
	// path that returns or drops a request must see them.
	path := filepath.Join(t.TempDir(), "journal.db")
	s, err := boltjournal.Open(path, &boltjournal.Options{ScrubDelay: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	body := func(tag string, n int) []byte {
		return append([]byte(`{"card":"`+tag+`","pad":"`), append(bytes.Repeat([]byte{'p'}, n), `"}`...)...)
	}
	big, small := newOp("a-big"), newOp("b-small")
	big.Name = "pay:big"
	big.Body, small.Body = body("4000000000000002", 200<<10), body("4000000000000010", 100)
	mustReserve(t, s, big)
	mustReserve(t, s, small)
	if got, err := s.Get(ctx, "a-big"); err != nil || !bytes.Equal(got.Body, big.Body) {
		t.Fatalf("Get: body of %d bytes, %v; want %d", len(got.Body), err, len(big.Body))
	}
	if got, created, err := s.Reserve(ctx, big); err != nil || created || !bytes.Equal(got.Body, big.Body) {
		t.Fatalf("Reserve of the existing record: created %v, body of %d bytes, %v", created, len(got.Body), err)
	}
	ops, err := s.Pending(ctx, "", 0)
	if err != nil || len(ops) != 2 || !bytes.Equal(ops[0].Body, big.Body) || !bytes.Equal(ops[1].Body, small.Body) {
		t.Fatalf("Pending = %v, %v; want both with their bodies", keys(ops), err)
	}
	l := idemstore.Lease{Owner: "resumer", At: time.Now(), Until: time.Now().Add(time.Minute)}
	ops, err = s.Claim(ctx, l, "", 0)
	if err != nil || len(ops) != 2 || !bytes.Equal(ops[0].Body, big.Body) {
		t.Fatalf("Claim = %v, %v; want both, the big one with its body", keys(ops), err)
	}
	if got, err := s.Get(ctx, "a-big"); err != nil || got.Owner != "resumer" || !bytes.Equal(got.Body, big.Body) {
		t.Fatalf("after Claim: owner %q body of %d bytes, %v", got.Owner, len(got.Body), err)
	}
	if err := s.Finish(ctx, "a-big", idemstore.Outcome{State: idemstore.StateSucceeded, Status: 201, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "a-big"); err != nil || got.Body != nil || got.State != idemstore.StateSucceeded {
		t.Fatalf("after Finish: state %v body of %d bytes, %v", got.State, len(got.Body), err)
	}
	if n, err := s.Sweep(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("Sweep = %d, %v", n, err)
	}
	// Acquire makes it pending again with a new large body.
	again := body("4000000000000028", 64<<10)
	if _, err := s.Acquire(ctx, "a-big", l, idemstore.Request{URL: "https://api.example.com/v1/charges", Body: again}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Named(ctx, "pay:big"); err != nil || !bytes.Equal(got.Body, again) {
		t.Fatalf("after Acquire: body of %d bytes, %v", len(got.Body), err)
	}
	if err := s.Finish(ctx, "a-big", idemstore.Outcome{State: idemstore.StateFailed, Status: 400}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, card := range []string{"4000000000000002", "4000000000000028"} {
		if bytes.Contains(b, []byte(card)) {
			t.Errorf("the body with %s is still in the file after its operation finished", card)
		}
	}
	if !bytes.Contains(b, []byte("4000000000000010")) {
		t.Error("the pending operation's body is gone from the file")
	}
	checkFile(t, path)
	s = openBolt(t, path)
	if n, err := s.Sweep(ctx, time.Now().Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("Sweep after reopening = %d, %v; want the one finished record", n, err)
	}
	if ops, err := s.Pending(ctx, "", 0); err != nil || len(ops) != 1 || !bytes.Equal(ops[0].Body, small.Body) {
		t.Fatalf("Pending after the sweep = %v, %v", keys(ops), err)
	}
}

func TestBoltStoreOnCommitAndLastChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	var (
		mu      sync.Mutex
		commits int
		changes int
	)
	s, err := boltjournal.Open(path, &boltjournal.Options{OnCommit: func(n int, d time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err == nil && d >= 0 {
			commits++
			changes += n
		}
	}})
	require.NoError(t, err)
	last, err := s.LastChange(t.Context())
	require.NoError(t, err)
	assert.True(t, last.IsZero(), "a new journal has no last change")
	for _, k := range []string{"a", "b", "c"} {
		mustReserve(t, s, newOp(k))
	}
	mu.Lock()
	assert.Positive(t, commits)
	assert.GreaterOrEqual(t, changes, 3, "every reservation rode a commit the hook heard of")
	mu.Unlock()
	require.NoError(t, s.Close())

	when := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	require.NoError(t, os.Chtimes(path, when, when))
	s, err = boltjournal.Open(path, nil)
	require.NoError(t, err)
	defer s.Close()
	last, err = s.LastChange(t.Context())
	require.NoError(t, err)
	assert.True(t, last.Equal(when), "LastChange = %v, want the file's time %v", last, when)
}
