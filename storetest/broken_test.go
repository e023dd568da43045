package storetest

// The suite proves itself: run under a recorder, it must pass the memory
// store and fail each deliberately broken one.

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
)

// recorder is a T that records failures instead of reporting them. Fatal
// and Skip end the test's goroutine, as testing.T's do.
type recorder struct {
	ctx     context.Context
	mu      sync.Mutex
	failed  []string
	skipped bool
}

func (r *recorder) Helper()                  {}
func (r *recorder) Context() context.Context { return r.ctx }
func (r *recorder) fail(msg string) {
	r.mu.Lock()
	r.failed = append(r.failed, msg)
	r.mu.Unlock()
}
func (r *recorder) Error(args ...any)                 { r.fail(fmt.Sprint(args...)) }
func (r *recorder) Errorf(format string, args ...any) { r.fail(fmt.Sprintf(format, args...)) }
func (r *recorder) Fatal(args ...any)                 { r.fail(fmt.Sprint(args...)); runtime.Goexit() }
func (r *recorder) Fatalf(format string, args ...any) {
	r.fail(fmt.Sprintf(format, args...))
	runtime.Goexit()
}
func (r *recorder) Skip(args ...any) { r.skipped = true; runtime.Goexit() }

// runRecorded runs every contract test on c under a recorder and returns
// the failures by test name.
func runRecorded(t *testing.T, c Config) map[string][]string {
	failures := map[string][]string{}
	for _, tc := range tests {
		ctx, cancel := context.WithCancel(t.Context())
		r := &recorder{ctx: ctx}
		done := make(chan struct{})
		go func() {
			defer close(done)
			runCase(t, r, c, tc.run)
		}()
		<-done
		cancel()
		if len(r.failed) > 0 {
			failures[tc.name] = r.failed
		}
	}
	return failures
}

func memory(*testing.T) idem.KeyStore { return idem.NewMemoryStore() }

func TestSuitePassesTheMemoryStore(t *testing.T) {
	if f := runRecorded(t, Config{Open: memory}); len(f) > 0 {
		t.Fatalf("the memory store failed under the recorder: %v", f)
	}
}

// broken is a memory store with one method replaced.
type broken struct {
	*idem.MemoryStore
	reserve func(ctx context.Context, op idem.Operation) (idem.Operation, bool, error)
	finish  func(ctx context.Context, key string, o idem.Outcome) error
	attempt func(ctx context.Context, key string, a idem.Attempt) error
	claim   func(ctx context.Context, l idem.Lease, after string, limit int) ([]idem.Operation, error)
	get     func(ctx context.Context, key string) (idem.Operation, error)
}

func (b *broken) Reserve(ctx context.Context, op idem.Operation) (idem.Operation, bool, error) {
	if b.reserve != nil {
		return b.reserve(ctx, op)
	}
	return b.MemoryStore.Reserve(ctx, op)
}

func (b *broken) Finish(ctx context.Context, key string, o idem.Outcome) error {
	if b.finish != nil {
		return b.finish(ctx, key, o)
	}
	return b.MemoryStore.Finish(ctx, key, o)
}

func (b *broken) Attempt(ctx context.Context, key string, a idem.Attempt) error {
	if b.attempt != nil {
		return b.attempt(ctx, key, a)
	}
	return b.MemoryStore.Attempt(ctx, key, a)
}

func (b *broken) Claim(ctx context.Context, l idem.Lease, after string, limit int) ([]idem.Operation, error) {
	if b.claim != nil {
		return b.claim(ctx, l, after, limit)
	}
	return b.MemoryStore.Claim(ctx, l, after, limit)
}

func (b *broken) Get(ctx context.Context, key string) (idem.Operation, error) {
	if b.get != nil {
		return b.get(ctx, key)
	}
	return b.MemoryStore.Get(ctx, key)
}

// finishKeepsBody keeps the request of a finished operation.
func finishKeepsBody(*testing.T) idem.KeyStore {
	b := &broken{MemoryStore: idem.NewMemoryStore()}
	var mu sync.Mutex
	kept := map[string]idem.Operation{}
	b.finish = func(ctx context.Context, key string, o idem.Outcome) error {
		if op, err := b.MemoryStore.Get(ctx, key); err == nil {
			mu.Lock()
			kept[key] = op
			mu.Unlock()
		}
		return b.MemoryStore.Finish(ctx, key, o)
	}
	b.get = func(ctx context.Context, key string) (idem.Operation, error) {
		op, err := b.MemoryStore.Get(ctx, key)
		mu.Lock()
		defer mu.Unlock()
		if k, ok := kept[key]; ok && err == nil && op.State.Finished() {
			op.Header, op.Body, op.URL = k.Header, k.Body, k.URL
		}
		return op, err
	}
	return b
}

// claimIgnoresLeases hands out every pending operation, leased or not.
func claimIgnoresLeases(*testing.T) idem.KeyStore {
	b := &broken{MemoryStore: idem.NewMemoryStore()}
	b.claim = func(ctx context.Context, l idem.Lease, after string, limit int) ([]idem.Operation, error) {
		ops, err := b.MemoryStore.Pending(ctx, after, limit)
		for i := range ops {
			ops[i].Owner, ops[i].LeaseUntil = l.Owner, l.Until
		}
		return ops, err
	}
	return b
}

// reserveNotAtomicByName looks a name up and reserves in two steps, with
// a gap between them.
func reserveNotAtomicByName(*testing.T) idem.KeyStore {
	b := &broken{MemoryStore: idem.NewMemoryStore()}
	var mu sync.Mutex
	names := map[string]string{}
	b.reserve = func(ctx context.Context, op idem.Operation) (idem.Operation, bool, error) {
		if op.Name != "" {
			mu.Lock()
			key, ok := names[op.Name]
			mu.Unlock()
			if ok {
				rec, err := b.MemoryStore.Get(ctx, key)
				return rec, false, err
			}
			time.Sleep(time.Millisecond) // the gap where another reservation slips in
		}
		name := op.Name
		op.Name = ""
		rec, created, err := b.MemoryStore.Reserve(ctx, op)
		if created && name != "" {
			mu.Lock()
			names[name] = op.Key
			mu.Unlock()
			rec.Name = name
		}
		return rec, created, err
	}
	return b
}

// readsItsOwnClock stamps marks with its own clock instead of the time it
// is given.
func readsItsOwnClock(*testing.T) idem.KeyStore {
	b := &broken{MemoryStore: idem.NewMemoryStore()}
	b.attempt = func(ctx context.Context, key string, a idem.Attempt) error {
		a.At = time.Now()
		return b.MemoryStore.Attempt(ctx, key, a)
	}
	b.finish = func(ctx context.Context, key string, o idem.Outcome) error {
		o.At = time.Now()
		return b.MemoryStore.Finish(ctx, key, o)
	}
	return b
}

// dropsTheKeyHeader forgets the header each operation's key travels in.
func dropsTheKeyHeader(*testing.T) idem.KeyStore {
	b := &broken{MemoryStore: idem.NewMemoryStore()}
	b.reserve = func(ctx context.Context, op idem.Operation) (idem.Operation, bool, error) {
		op.KeyHeader = ""
		return b.MemoryStore.Reserve(ctx, op)
	}
	return b
}

// historyUnbounded keeps every attempt of an operation in its history,
// never dropping the oldest.
func historyUnbounded(*testing.T) idem.KeyStore {
	b := &broken{MemoryStore: idem.NewMemoryStore()}
	var mu sync.Mutex
	all := map[string][]idem.Attempt{}
	b.attempt = func(ctx context.Context, key string, a idem.Attempt) error {
		err := b.MemoryStore.Attempt(ctx, key, a)
		if err == nil {
			mu.Lock()
			all[key] = append(all[key], a)
			mu.Unlock()
		}
		return err
	}
	b.get = func(ctx context.Context, key string) (idem.Operation, error) {
		op, err := b.MemoryStore.Get(ctx, key)
		mu.Lock()
		defer mu.Unlock()
		if h, ok := all[key]; ok && err == nil {
			op.History = h
		}
		return op, err
	}
	return b
}

// historyDroppedByFinish forgets an operation's history when it finishes.
func historyDroppedByFinish(*testing.T) idem.KeyStore {
	b := &broken{MemoryStore: idem.NewMemoryStore()}
	b.get = func(ctx context.Context, key string) (idem.Operation, error) {
		op, err := b.MemoryStore.Get(ctx, key)
		if op.State.Finished() {
			op.History = nil
		}
		return op, err
	}
	return b
}

// historyNotKept records attempts without their history, as a store
// written before it existed would.
func historyNotKept(*testing.T) idem.KeyStore {
	b := &broken{MemoryStore: idem.NewMemoryStore()}
	b.get = func(ctx context.Context, key string) (idem.Operation, error) {
		op, err := b.MemoryStore.Get(ctx, key)
		op.History = nil
		return op, err
	}
	return b
}

// dropsTheTrace forgets each operation's trace context.
func dropsTheTrace(*testing.T) idem.KeyStore {
	b := &broken{MemoryStore: idem.NewMemoryStore()}
	b.reserve = func(ctx context.Context, op idem.Operation) (idem.Operation, bool, error) {
		op.Trace = ""
		return b.MemoryStore.Reserve(ctx, op)
	}
	return b
}

// finishRedactsItself keeps the URL it derives from the record, as
// pgstore once did (dropping only a query), instead of the one the journal
// passes.
func finishRedactsItself(*testing.T) idem.KeyStore {
	b := &broken{MemoryStore: idem.NewMemoryStore()}
	b.finish = func(ctx context.Context, key string, o idem.Outcome) error {
		if op, err := b.MemoryStore.Get(ctx, key); err == nil {
			o.URL, _, _ = strings.Cut(op.URL, "?")
		}
		return b.MemoryStore.Finish(ctx, key, o)
	}
	return b
}

// unconditionalMarks writes every Attempt and Finish, whoever holds the
// record and whatever its state, as every store did: a late mark of an
// owner that lost the operation overwrites the outcome of the one that
// took it over.
func unconditionalMarks(*testing.T) idem.KeyStore {
	b := &broken{MemoryStore: idem.NewMemoryStore()}
	b.attempt = func(ctx context.Context, key string, a idem.Attempt) error {
		a.Owner = "" // an empty owner marks unconditionally
		return b.MemoryStore.Attempt(ctx, key, a)
	}
	b.finish = func(ctx context.Context, key string, o idem.Outcome) error {
		o.Owner = ""
		return b.MemoryStore.Finish(ctx, key, o)
	}
	return b
}

// marksIgnoreTheState writes the marks of the record's owner whatever
// its state: the owner's late Finish rewrites its own finished outcome.
func marksIgnoreTheState(*testing.T) idem.KeyStore {
	b := &broken{MemoryStore: idem.NewMemoryStore()}
	ownedBy := func(ctx context.Context, key, owner string) bool {
		op, err := b.MemoryStore.Get(ctx, key)
		return err == nil && op.Owner == owner
	}
	b.attempt = func(ctx context.Context, key string, a idem.Attempt) error {
		if ownedBy(ctx, key, a.Owner) {
			a.Owner = ""
		}
		return b.MemoryStore.Attempt(ctx, key, a)
	}
	b.finish = func(ctx context.Context, key string, o idem.Outcome) error {
		if ownedBy(ctx, key, o.Owner) {
			o.Owner = ""
		}
		return b.MemoryStore.Finish(ctx, key, o)
	}
	return b
}

// acquireKeepsOldRequest reopens a finished operation without the new
// request it is given.
func acquireKeepsOldRequest(*testing.T) idem.KeyStore {
	return &acquireBroken{broken: &broken{MemoryStore: idem.NewMemoryStore()}}
}

type acquireBroken struct {
	*broken
	keepURL bool
}

func (a *acquireBroken) Acquire(ctx context.Context, key string, l idem.Lease, req idem.Request) (idem.Operation, error) {
	if a.keepURL { // the request it is given, but the URL the finished record kept
		if rec, err := a.MemoryStore.Get(ctx, key); err == nil {
			req.URL = rec.URL
		}
		return a.MemoryStore.Acquire(ctx, key, l, req)
	}
	return a.MemoryStore.Acquire(ctx, key, l, idem.Request{})
}

// acquireKeepsFinishedURL reopens a finished operation with the header
// and body it is given but the URL the finished record kept (without its
// query), as every store did: Resume then sent another request.
func acquireKeepsFinishedURL(*testing.T) idem.KeyStore {
	return &acquireBroken{broken: &broken{MemoryStore: idem.NewMemoryStore()}, keepURL: true}
}

func TestSuiteFailsBrokenStores(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config Config
		// want names a test that must fail, so the right one catches it.
		want string
	}{
		{"Finish keeps the body", Config{Open: finishKeepsBody}, "Finish records the outcome and drops the request"},
		{"Claim ignores leases", Config{Open: claimIgnoresLeases}, "Claim takes its own and lapsed operations, never a live lease"},
		{"Reserve not atomic by name", Config{Open: reserveNotAtomicByName}, "one name, one key under 64 concurrent reservations"},
		{"a reopen loses everything", Config{Open: memory, Reopen: func(*testing.T, idem.KeyStore) idem.KeyStore {
			return idem.NewMemoryStore()
		}}, "what was accepted survives reopening"},
		{"reads its own clock", Config{Open: readsItsOwnClock}, "Attempt counts requests and keeps the operation pending"},
		{"drops the key header", Config{Open: dropsTheKeyHeader}, "the key header travels with the record"},
		{"Acquire keeps the old request", Config{Open: acquireKeepsOldRequest}, "Acquire reopens a finished record with the request it is given"},
		{"Acquire keeps the finished URL", Config{Open: acquireKeepsFinishedURL}, "Acquire reopens a finished record with the request it is given"},
		{"Finish redacts the URL itself", Config{Open: finishRedactsItself}, "Finish records the outcome and drops the request"},
		{"the history is unbounded", Config{Open: historyUnbounded}, "Attempt keeps a bounded history, oldest dropped first"},
		{"Finish drops the history", Config{Open: historyDroppedByFinish}, "the history and the trace are kept by Finish and Acquire"},
		{"no history kept", Config{Open: historyNotKept}, "Attempt counts requests and keeps the operation pending"},
		{"drops the trace", Config{Open: dropsTheTrace}, "the history and the trace are kept by Finish and Acquire"},
		{"marks ignore the owner", Config{Open: unconditionalMarks}, "a mark from an owner that lost the record changes nothing"},
		{"marks ignore the state", Config{Open: marksIgnoreTheState}, "a mark from an owner that lost the record changes nothing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := runRecorded(t, tc.config)
			if len(f) == 0 {
				t.Fatal("the suite passed a broken store")
			}
			if _, ok := f[tc.want]; !ok {
				names := make([]string, 0, len(f))
				for n := range f {
					names = append(names, n)
				}
				t.Fatalf("%q did not fail; these did: %s", tc.want, strings.Join(names, "; "))
			}
		})
	}
}
